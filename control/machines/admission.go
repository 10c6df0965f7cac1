package machines

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// Admission verbs: what an agent may ask of the control plane about its
// own machine record. An agent never writes a machine record (its region,
// labels and state are the operator's): it asks, and the control plane
// checks the request against the subject its credentials bind it to.
const (
	// AdmitJoin redeems an invite and records the machine.
	AdmitJoin = "join"
	// AdmitAddress moves the machine to another address: only to the
	// mesh IP the registrar recorded for it (see move); any other move is
	// the operator's (SetAddress, `control machine address`).
	AdmitAddress = "address"
)

// AdmissionRequest is an agent's join or address change.
type AdmissionRequest struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	Token   string `json:"token,omitempty"`
	Address string `json:"address"`
}

// AdmissionPolicy is what a control server's admission accepts beyond
// what every request is checked for.
type AdmissionPolicy struct {
	// LoopbackJoins admits a machine at a loopback address its agent
	// names. Gateways dial a machine's instances at its admitted address,
	// and at a loopback one a gateway dials its own box: right for a
	// single host, whose store no other box reaches (the control server
	// sets this when its store listens on loopback only), and a way for a
	// stolen invite to aim gateways at their own loopback anywhere else.
	// An invite that pins a loopback address (`machine invite --address`)
	// admits at it either way.
	LoopbackJoins bool
}

// ServeAdmission answers agents' admission requests under policy until ctx
// ends or the returned stop is called; every control server runs it.
func ServeAdmission(ctx context.Context, s *store.Store, policy AdmissionPolicy) (func(), error) {
	return store.Serve(ctx, s.NC, s.Names.AdmissionSubject("*", "*"), "admission", "rpc.admission",
		func(ctx context.Context, command string, data []byte) (any, error) {
			verb, machine, _ := strings.Cut(command, ".")
			var req AdmissionRequest
			if err := json.Unmarshal(data, &req); err != nil {
				return nil, store.Errorf(store.CodeInvalid, "admission request: %w", err)
			}
			// The subject is what the credentials bind; the body must agree.
			if req.Machine != machine {
				return nil, store.Errorf(store.CodeInvalid, "admission request for machine %q sent on machine %q's subject", req.Machine, machine).
					With("machine", machine)
			}
			ip, err := CheckAddress(machine, req.Address)
			if err != nil {
				return nil, err
			}
			if err := checkUnclaimed(ctx, s, machine, ip); err != nil {
				return nil, err
			}
			switch verb {
			case AdmitJoin:
				return admit(ctx, s, req.Token, machine, req.Address, policy)
			case AdmitAddress:
				return move(ctx, s, machine, req.Address)
			}
			return nil, store.Errorf(store.CodeInvalid, "unknown admission request %q", verb)
		})
}

// move changes a member machine's address at its agent's request; it
// admits no one. The address is where every gateway sends the machine's
// traffic, and an agent's credentials are assumed stolen some day: so an
// agent may move its machine only to the mesh IP the registrar recorded
// for it (a record the control plane signs), as an agent that joined
// before its meshd registered does. Any other move is the operator's.
func move(ctx context.Context, s *store.Store, id, address string) (*store.MachineRecord, error) {
	cur, _, err := s.GetMachine(ctx, id)
	if err != nil {
		return nil, err
	}
	if sameIP(cur.Address, address) {
		return cur, nil
	}
	mesh := ""
	switch peer, err := s.MeshPeer(ctx, id); {
	case err == nil:
		mesh = peer.MeshIP
	case !store.HasCode(err, store.CodeNotFound) && !store.HasCode(err, store.CodeBadSignature):
		return nil, err
	}
	if mesh == "" || !sameIP(mesh, address) {
		why := "it has no mesh IP"
		if mesh != "" {
			why = "its mesh IP is " + mesh
		}
		return nil, store.Errorf(store.CodeInvalid,
			"machine %s may not move itself from %s to %s (%s): an agent may move its machine only to its mesh IP; an operator moves it with `control machine address %s %s`",
			id, cur.Address, address, why, id, address).
			With("machine", id).With("address", cur.Address).With("requested", address).With("mesh_ip", mesh).
			With("command", fmt.Sprintf("control machine address %s %s", id, address))
	}
	moved, err := SetAddress(ctx, s, id, address)
	if err != nil {
		return nil, err
	}
	return &moved.MachineRecord, nil
}

// CheckAddress parses address, an IP a machine is to be reached at, and
// refuses one no endpoint may be dialled at: unspecified, multicast and
// link-local addresses (169.254.169.254 is cloud metadata). Loopback is
// allowed: a single box's machine is reached at 127.0.0.1.
func CheckAddress(machine, address string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(address)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, store.Errorf(store.CodeInvalid, "address %q is not an IP address", address).With("machine", machine).With("address", address)
	}
	if class := store.SpecialAddress(ip); class != "" && class != "loopback" {
		return netip.Addr{}, store.Errorf(store.CodeInvalid, "address %s (%s): no machine is reached there", address, class).
			With("machine", machine).With("address", address)
	}
	return ip.Unmap(), nil
}

// checkUnclaimed refuses ip for machine id when another member is
// reached there: gateways would take that machine's endpoints for id's.
// Loopback is shared: every machine of a single-host test bed is
// reached on it.
func checkUnclaimed(ctx context.Context, s *store.Store, id string, ip netip.Addr) error {
	if ip.IsLoopback() {
		return nil
	}
	var other string
	err := s.ListMachines(ctx, func(m *store.MachineRecord) error {
		if m.ID != id && other == "" && sameIP(m.Address, ip.String()) {
			other = m.ID
		}
		return nil
	})
	if err != nil {
		return err
	}
	if other != "" {
		return store.Errorf(store.CodeConflict, "address %s is machine %s's: a machine is reached at an address of its own", ip, other).
			With("machine", id).With("address", ip.String()).With("owner", other)
	}
	return nil
}

// sameIP reports whether a and b are the same IP address, however written.
func sameIP(a, b string) bool {
	x, err1 := netip.ParseAddr(a)
	y, err2 := netip.ParseAddr(b)
	if err1 != nil || err2 != nil {
		return a == b
	}
	return x.Unmap() == y.Unmap()
}

// RequestAdmission asks the control plane to admit (AdmitJoin, with an
// invite token) or move (AdmitAddress) machine, and returns its record.
func RequestAdmission(ctx context.Context, s *store.Store, verb string, req AdmissionRequest) (*store.MachineRecord, error) {
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: letters, digits, '-' and '_' only", req.Machine).With("machine", req.Machine)
	}
	req.Version = store.RecordVersion
	var rec store.MachineRecord
	err := store.Call(ctx, s.NC, s.Names.AdmissionSubject(verb, req.Machine), req.Machine, "admission."+verb, req, &rec)
	if store.HasCode(err, store.CodeRPCFailure) {
		return nil, fmt.Errorf("asking the control plane to admit machine %s: %w (is `control server` running?)", req.Machine, err)
	}
	if err != nil {
		return nil, err
	}
	if rec.ID != req.Machine {
		return nil, store.Errorf(store.CodeInternal, "admission answered for machine %q, not %q", rec.ID, req.Machine)
	}
	return &rec, nil
}
