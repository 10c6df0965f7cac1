// Package machines is machine membership: explicit admission with
// single-use invites, the machine records (durable intent), state changes an
// operator asks for, and live reachability read at the moment it is shown,
// never stored.
package machines

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
)

// Admit records machine id from a redeemed invite. An invite admits once
// (an agent restarted with --join on a box that joined starts from its
// saved identity and does not ask again), and only a machine that is not a
// member yet: the invite is not spent on a refusal.
func Admit(ctx context.Context, s *store.Store, token, id, address string) (*store.MachineRecord, error) {
	return admit(ctx, s, token, id, address, AdmissionPolicy{LoopbackJoins: true})
}

// admit is Admit under policy: an invite that pins an address admits only
// at it, and a loopback address needs the policy or such an invite.
func admit(ctx context.Context, s *store.Store, token, id, address string, policy AdmissionPolicy) (*store.MachineRecord, error) {
	if !store.ValidToken(id) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: letters, digits, '-' and '_' only", id).With("machine", id)
	}
	member := func() error {
		return store.Errorf(store.CodeConflict, "machine %s is already a member; restart its agent without --join, or choose another --machine", id).With("machine", id)
	}
	switch _, _, err := s.GetMachine(ctx, id); {
	case err == nil:
		return nil, member()
	case !store.HasCode(err, store.CodeNotFound):
		return nil, err
	}
	inv, err := invites.Redeem(ctx, s, token, id, store.InviteUseAdmit, func(inv *store.Invite) error {
		return checkInviteAddress(id, address, inv, policy)
	})
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := &store.MachineRecord{
		Version: store.RecordVersion, ID: id, Region: inv.Region, Labels: inv.Labels,
		State: store.MachineActive, Address: address, JoinedAt: now, UpdatedAt: now,
	}
	if err := create(ctx, s, rec); err != nil {
		if store.HasCode(err, store.CodeConflict) {
			return nil, member()
		}
		return nil, err
	}
	return rec, nil
}

// Register records the local machine of a single-box `control server
// --agent`, which the operator asked for explicitly by that flag. An
// existing record is kept (its state may have been changed since), only its
// address follows the flag (SetAddress).
func Register(ctx context.Context, s *store.Store, id, address string) (*store.MachineRecord, error) {
	ip, err := CheckAddress(id, address)
	if err != nil {
		return nil, err
	}
	cur, _, err := s.GetMachine(ctx, id)
	if err == nil {
		if sameIP(cur.Address, address) {
			return cur, nil
		}
		moved, err := SetAddress(ctx, s, id, address)
		if err != nil {
			return nil, err
		}
		return &moved.MachineRecord, nil
	}
	if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	now := time.Now().UTC()
	rec := &store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive, Address: ip.String(), JoinedAt: now, UpdatedAt: now}
	return rec, create(ctx, s, rec)
}

// Moved is what SetAddress did.
type Moved struct {
	store.MachineRecord
	// From is the address the machine had.
	From string `json:"from"`
	// Republished are the services ("ns/service") with an instance on
	// the machine, whose routing was published again at its address.
	Republished []string `json:"republished,omitempty"`
}

// SetAddress moves machine id to address: an operator's act (`control
// machine address`), or an agent's move to its mesh IP (move). The
// address is where every gateway and DNS server reaches the machine's
// instances, and the only one they dial for it. The record changes and a
// machine upsert tells every projection, which stops dialling the
// machine's endpoints at the old address at once; then every service with
// an instance on it is published again, at the new one. Instances listen
// where their agent started them: ones bound to the old address are
// reached again once the agent restarted (it reads its record at start)
// and started them anew (the next apply of their namespace). Moving a
// machine to the address it has publishes its services again all the
// same, which finishes a move that was interrupted.
func SetAddress(ctx context.Context, s *store.Store, id, address string) (*Moved, error) {
	ip, err := CheckAddress(id, address)
	if err != nil {
		return nil, err
	}
	if err := checkUnclaimed(ctx, s, id, ip); err != nil {
		return nil, err
	}
	cur, rev, err := s.GetMachine(ctx, id)
	if err != nil {
		return nil, err
	}
	out := &Moved{From: cur.Address}
	if !sameIP(cur.Address, address) {
		cur.Address, cur.UpdatedAt = ip.String(), time.Now().UTC()
		if err := update(ctx, s, cur, rev); err != nil {
			return nil, err
		}
	}
	out.MachineRecord = *cur
	services := map[string]bool{}
	err = s.ListInstances(ctx, "*."+id+".*", func(_ string, in *store.InstanceRecord) error {
		services[in.Namespace+"/"+in.Service] = true
		return nil
	})
	if err != nil {
		return out, err
	}
	for _, key := range slices.Sorted(maps.Keys(services)) {
		ns, svc, _ := strings.Cut(key, "/")
		if _, err := routing.RepublishService(ctx, s, ns, svc); err != nil && !store.HasCode(err, store.CodeNotFound) {
			return out, fmt.Errorf("publishing %s at machine %s's address %s: %w", key, id, cur.Address, err)
		}
		out.Republished = append(out.Republished, key)
	}
	return out, nil
}

// create records rec and publishes it to every projection.
func create(ctx context.Context, s *store.Store, rec *store.MachineRecord) error {
	if err := s.CreateMachine(ctx, rec); err != nil {
		return err
	}
	return publishMachine(ctx, s, rec)
}

// update replaces the record at rev with rec and publishes it.
func update(ctx context.Context, s *store.Store, rec *store.MachineRecord, rev uint64) error {
	if err := s.UpdateMachine(ctx, rec, rev); err != nil {
		return err
	}
	return publishMachine(ctx, s, rec)
}

func publishMachine(ctx context.Context, s *store.Store, rec *store.MachineRecord) error {
	_, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: rec, At: time.Now().UTC()}})
	return err
}

// Get reads one machine record.
func Get(ctx context.Context, s *store.Store, id string) (*store.MachineRecord, error) {
	rec, _, err := s.GetMachine(ctx, id)
	return rec, err
}

// SetState moves machine id to state (active, draining or disabled).
func SetState(ctx context.Context, s *store.Store, id, state string) (*store.MachineRecord, error) {
	switch state {
	case store.MachineActive, store.MachineDraining, store.MachineDisabled:
	default:
		return nil, store.Errorf(store.CodeInvalid, "unknown machine state %q", state)
	}
	rec, rev, err := s.GetMachine(ctx, id)
	if err != nil {
		return nil, err
	}
	rec.State, rec.UpdatedAt = state, time.Now().UTC()
	return rec, update(ctx, s, rec, rev)
}

// Listed is a machine with what its agent last said of it, and, when
// probed, its reachability as observed right now.
type Listed struct {
	store.MachineRecord
	// Liveness is computed from the last heartbeat (store.MachineFresh,
	// MachineStale, MachineOffline, MachineNeverSeen); LastBeat is when.
	Liveness string    `json:"liveness"`
	LastBeat time.Time `json:"last_beat,omitzero"`
	// Instances and Free are from the agent's last state (or the probe).
	Instances int      `json:"instances"`
	Free      int      `json:"free"`
	Drivers   []string `json:"drivers,omitempty"`
	// Release and Arch are the agent's version and GOOS/GOARCH; Upgrade
	// its latest upgrade (from its state).
	Release string               `json:"release,omitempty"`
	Arch    string               `json:"arch,omitempty"`
	Upgrade *store.UpgradeStatus `json:"upgrade,omitempty"`
	// Probed is set when the machine was asked just now; Reachable, RTT
	// and Problem say how that went.
	Probed    bool   `json:"probed,omitempty"`
	Reachable bool   `json:"reachable"`
	RTT       string `json:"rtt,omitempty"`
	Problem   string `json:"problem,omitempty"`
}

// List returns every machine with its liveness and state as its agent last
// wrote them: reads only, no call to any machine. With probe, every
// machine is also asked now (timeout each).
func List(ctx context.Context, s *store.Store, probe bool, timeout time.Duration) ([]Listed, error) {
	var out []Listed
	err := s.ListMachines(ctx, func(m *store.MachineRecord) error {
		out = append(out, Listed{MachineRecord: *m})
		return nil
	})
	if err != nil {
		return nil, err
	}
	states, beats, err := s.MachineObservations(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	for i := range out {
		l := &out[i]
		var b *store.MachineBeat
		if beat, ok := beats[l.ID]; ok {
			b = &beat
			l.LastBeat = beat.At
		}
		l.Liveness = b.Liveness(now)
		if st, ok := states[l.ID]; ok {
			l.Instances, l.Free, l.Drivers = st.Instances, st.Free, st.Drivers
			l.Release, l.Arch, l.Upgrade = st.Release, st.Arch, st.Upgrade
		}
		if l.Release == "" && b != nil {
			l.Release = b.Release
		}
	}
	if !probe {
		return out, nil
	}
	ids := make([]string, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	for i, p := range Probe(ctx, s, ids, timeout) {
		out[i].Probed = true
		if p.Err != nil {
			out[i].Problem = p.Err.Error()
			continue
		}
		out[i].Reachable, out[i].RTT = true, p.RTT.Round(10*time.Microsecond).String()
		out[i].Instances, out[i].Free, out[i].Drivers = p.Reply.Instances, p.Reply.Free, p.Reply.Drivers
	}
	return out, nil
}

// Probed is one machine's answer to a capacity probe: its reply and the
// round trip, or why it did not answer.
type Probed struct {
	Reply *store.CapacityReply
	RTT   time.Duration
	Err   error
}

// Probe asks every machine of ids for its live capacity at once, each
// within timeout; result i is ids[i]'s.
func Probe(ctx context.Context, s *store.Store, ids []string, timeout time.Duration) []Probed {
	out := make([]Probed, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			var rep store.CapacityReply
			if out[i].Err = s.Call(pctx, id, store.CmdCapacity, store.CapacityRequest{}, &rep); out[i].Err == nil {
				out[i].Reply, out[i].RTT = &rep, time.Since(start)
			}
		}()
	}
	wg.Wait()
	return out
}

// Removed is what Remove did.
type Removed struct {
	Machine string `json:"machine"`
	Forced  bool   `json:"forced"`
	// Reachable says whether the machine answered when asked.
	Reachable bool `json:"reachable"`
	// Instances are the instance records forgotten with it.
	Instances []string `json:"instances,omitempty"`
	// Republished are the services ("ns/service") whose routing was
	// published again without its instances.
	Republished []string `json:"republished,omitempty"`
	// MeshIP is the mesh address it released ("" if it had none).
	MeshIP string `json:"mesh_ip,omitempty"`
	// Invites counts the redeemed invites voided with it.
	Invites int `json:"invites,omitempty"`
	// Credentials counts the recorded user keys of the machine revoked
	// with it (every role's, every renewal's).
	Credentials int `json:"credentials"`
}

// Remove retires machine id: its instances leave the routing, its instance
// and machine records are purged, its mesh peer, heartbeat and address go
// (through the registrar's eviction), the invite it joined with is void,
// a machine removal event takes it out of every projection (and so out
// of DNS), and every credential recorded for it is revoked. Without force
// it is refused while the machine answers and runs instances, or has
// instance records: drain it and deploy again so they move first. force is for a dead or stolen machine; instances it still
// runs are asked to stop, best effort. The next apply places replacements
// of its slots elsewhere.
func Remove(ctx context.Context, s *store.Store, id string, force bool, probeTimeout time.Duration) (*Removed, error) {
	if _, err := Get(ctx, s, id); err != nil {
		return nil, err
	}
	out := &Removed{Machine: id, Forced: force}
	var insts []*store.InstanceRecord
	err := s.ListInstances(ctx, "*."+id+".*", func(_ string, in *store.InstanceRecord) error {
		insts = append(insts, in)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(insts, func(i, j int) bool { return insts[i].Key() < insts[j].Key() })
	probed := Probe(ctx, s, []string{id}, probeTimeout)[0]
	out.Reachable = probed.Err == nil
	running := 0
	if probed.Err == nil {
		running = probed.Reply.Instances
	}
	if !force && (running > 0 || len(insts) > 0) {
		how := "it does not answer"
		if out.Reachable {
			how = fmt.Sprintf("it answers and runs %d instances", running)
		}
		return nil, store.Errorf(store.CodeConflict,
			"machine %s still has %d instance records (%s): drain it (`control machine drain %s`) and deploy again so they move, or remove it with --force",
			id, len(insts), how, id).With("machine", id)
	}
	// Asking its agent to stop them is an order, which only a signer gives.
	if out.Reachable && len(insts) > 0 {
		if err := s.CanOrder(fmt.Sprintf("stopping machine %s's instances", id)); err != nil {
			return nil, err
		}
	}
	// Instances stop being routed first: records go, then every service
	// that had one is published again from what is left.
	services := map[string]bool{}
	for _, in := range insts {
		if out.Reachable {
			sctx, cancel := context.WithTimeout(ctx, probeTimeout+10*time.Second)
			_ = s.Call(sctx, id, store.CmdStopInstance, store.InstanceRequest{InstanceID: in.ID, Namespace: in.Namespace, Forget: true}, nil)
			cancel()
		}
		if err := s.DeleteInstance(ctx, in.Key()); err != nil {
			return out, fmt.Errorf("forgetting instance %s of machine %s: %w", in.ID, id, err)
		}
		out.Instances = append(out.Instances, in.ID)
		services[in.Namespace+"/"+in.Service] = true
	}
	for _, key := range slices.Sorted(maps.Keys(services)) {
		ns, svc, _ := strings.Cut(key, "/")
		if _, err := routing.RepublishService(ctx, s, ns, svc); err != nil && !store.HasCode(err, store.CodeNotFound) {
			return out, fmt.Errorf("publishing %s without machine %s's instances: %w", key, id, err)
		}
		out.Republished = append(out.Republished, key)
	}
	// Then the machine itself, from every projection and DNS.
	if _, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineRemove,
		Machine: &store.MachineRecord{Version: store.RecordVersion, ID: id}, At: time.Now().UTC()}}); err != nil {
		return out, err
	}
	reg, err := registrar.New(s, registrar.Config{})
	if err != nil {
		return out, err
	}
	switch left, err := reg.Evict(ctx, id); {
	case err == nil:
		out.MeshIP = left.ReleasedIP
	case !store.HasCode(err, store.CodeNotFound):
		return out, fmt.Errorf("removing machine %s from the mesh: %w", id, err)
	default:
		// Never a mesh member; a peer record without an address (a
		// static peer) goes all the same.
		if err := s.DeleteMeshPeer(ctx, id); err != nil {
			return out, err
		}
	}
	// The invite it joined with would admit it again.
	if out.Invites, err = invites.VoidOf(ctx, s, id); err != nil {
		return out, err
	}
	// And every key it was issued would still connect.
	if out.Credentials, err = s.RevokeMachineCredentials(ctx, id, "machine "+id+" removed"); err != nil {
		return out, err
	}
	// The record goes last: a removal cut short (a crash, a power cut)
	// is finished by running it again, which starts from the record.
	// Deleted first, it left the keys unrevoked and the invite valid with
	// nothing to run `machine rm` on.
	return out, s.DeleteMachine(ctx, id)
}

// checkInviteAddress refuses to admit machine id at address under inv:
// another address than the one inv pins, or a loopback address the policy
// does not admit and inv does not pin.
func checkInviteAddress(id, address string, inv *store.Invite, policy AdmissionPolicy) error {
	if inv.Address != "" {
		if !sameIP(inv.Address, address) {
			return store.Errorf(store.CodeInvalid, "the invite admits machine %s at %s only, not %s: join with --advertise %s, or ask for an invite for this address",
				id, inv.Address, address, inv.Address).With("machine", id).With("address", address).With("invite_address", inv.Address)
		}
		return nil
	}
	if ip, err := netip.ParseAddr(address); err == nil && ip.Unmap().IsLoopback() && !policy.LoopbackJoins {
		return store.Errorf(store.CodeInvalid,
			"machine %s asks to be admitted at loopback address %s, but other boxes reach this store: gateways would dial their own loopback for its instances; join with --advertise set to an address other boxes reach it at, or ask for an invite that pins this one (control machine invite --address %s)",
			id, address, address).With("machine", id).With("address", address)
	}
	return nil
}

// RunningInstance is instance id as machine's agent runs it (asked now),
// for one the store has no record of (it went back in time): enough to
// address a command to it.
func RunningInstance(ctx context.Context, s *store.Store, machine, id string) (*store.InstanceRecord, error) {
	var inv store.InventoryReply
	if err := s.Call(ctx, machine, store.CmdInventory, struct{}{}, &inv); err != nil {
		return nil, err
	}
	for _, it := range inv.Instances {
		if it.ID == id && !it.Unknown {
			return &store.InstanceRecord{ID: it.ID, Namespace: it.Namespace, Service: it.Service, Machine: machine}, nil
		}
	}
	return nil, store.Errorf(store.CodeNotFound, "machine %s runs no instance %s", machine, id).With("instance", id).With("machine", machine)
}
