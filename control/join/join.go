// Package join makes a box with the packages installed a member of a fleet
// in one step (`control join`) and takes it out again (`control leave`).
//
// Decisions others act on:
//   - One invite serves every role the box runs, each use of it once, all
//     bound to this machine (store/invites): the enrolment (keys made on
//     this box, one credentials file per role it runs), meshd's
//     registration (the invite's mesh use, made here with the mesh
//     credentials just enrolled, as `meshd join` would) and the agent's
//     admission (its admit use). The mesh goes before the admission, so
//     the machine is admitted at its mesh IP, as an agent started after
//     its meshd would be.
//   - Nothing lands in /etc/edgeplane or a service's state dir until every
//     redemption succeeded: credentials, identities and configs are made
//     in a staging dir beside the state dirs and moved into place at the
//     end. A wrong, expired or used invite writes nothing.
//   - A joined box is one whose record (STATE/join/joined.json) or agent
//     identity exists; joining it again changes nothing.
//   - The record names every file join put in place, and STATE/join/packaged
//     keeps the packaged configs it replaced: that is what leave removes and
//     restores, nothing else.
//   - Owners and modes are the units': the agent's state is root's, the
//     gateway's and meshd's belong to the service user (edgeplane); files
//     0600, dirs 0700; a replaced config keeps its owner and mode.
package join

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Layout is where the packages put a box's config and state.
type Layout struct {
	// Etc holds caddy.json and the units' env files (packaged:
	// /etc/edgeplane).
	Etc string
	// State holds each service's state dir (packaged: /var/lib/edgeplane).
	State string
}

// DefaultLayout is the packages' layout.
var DefaultLayout = Layout{Etc: "/etc/edgeplane", State: "/var/lib/edgeplane"}

// The state dirs, as the units name them (StateDirectory=).
func (l Layout) agentDir() string   { return filepath.Join(l.State, "agent") }
func (l Layout) gatewayDir() string { return filepath.Join(l.State, "gateway") }
func (l Layout) meshdDir() string   { return filepath.Join(l.State, "meshd") }

// recordDir holds the record of the join and the packaged configs it
// replaced; root's.
func (l Layout) recordDir() string   { return filepath.Join(l.State, "join") }
func (l Layout) recordFile() string  { return filepath.Join(l.recordDir(), "joined.json") }
func (l Layout) packagedDir() string { return filepath.Join(l.recordDir(), "packaged") }

// The units a box runs, by role.
const (
	UnitAgent   = "edgeplane-agent.service"
	UnitGateway = "edgeplane-gateway.service"
	UnitMeshd   = "edgeplane-meshd.service"
)

// Options say how a box joins.
type Options struct {
	Layout
	// Token is the invite from `control machine invite`; it names the
	// fleet's CAs the storage nodes are checked against.
	Token string
	// NATSURL names the storage nodes (comma-separated).
	NATSURL string
	// Machine is this box's machine ID; default: the host name.
	Machine string
	// Gateway and Mesh add the gateway's and meshd's roles to the agent's.
	Gateway, Mesh bool
	// EnrollAddrs are the storage nodes' enrollment addresses; default:
	// the NATSURL hosts at enroll.DefaultPort.
	EnrollAddrs []string
	// Advertise is the IP instances are reached at; default: the mesh IP
	// with Mesh, else 127.0.0.1 (as `control agent --advertise`).
	Advertise string
	// MeshMode and MeshPort are meshd's device mode (tun, netstack) and
	// WireGuard port (0: a free one, kept); defaults tun and 51820.
	MeshMode string
	MeshPort int
	// ServiceUser owns the gateway's and meshd's state; default edgeplane.
	ServiceUser string
	// Timeout bounds each call to the control plane; default 10s.
	Timeout time.Duration
}

// Record is what a join did, saved in STATE/join/joined.json.
type Record struct {
	Machine string `json:"machine"`
	// Address is the one the machine was admitted at.
	Address string `json:"address"`
	MeshIP  string `json:"mesh_ip,omitempty"`
	NATSURL string `json:"nats_url"`
	// Roles are the roles the box enrolled for (agent, gateway, mesh).
	Roles []string `json:"roles"`
	// Units are the systemd units the box runs.
	Units []string `json:"units"`
	// Files are the state files join put in place.
	Files []string `json:"files"`
	// Replaced are the configs join rewrote; their packaged versions are
	// kept under STATE/join/packaged by base name.
	Replaced []string  `json:"replaced"`
	JoinedAt time.Time `json:"joined_at"`
}

// Joined returns the record of this box's join, nil if it has not joined.
// A box whose agent joined without this command (`control agent --join`)
// counts as joined too, with a record that names its machine only.
func Joined(l Layout) (*Record, error) {
	b, err := os.ReadFile(l.recordFile())
	if err == nil {
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("reading %s: %w", l.recordFile(), err)
		}
		return &r, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the join record: %w", err)
	}
	b, err = os.ReadFile(filepath.Join(l.agentDir(), agent.IdentityFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the agent's identity: %w", err)
	}
	var ident agent.Identity
	if err := json.Unmarshal(b, &ident); err != nil || ident.Machine == "" {
		return nil, fmt.Errorf("agent identity %s is unreadable: %v", filepath.Join(l.agentDir(), agent.IdentityFile), err)
	}
	return &Record{Machine: ident.Machine, Address: ident.Address, JoinedAt: ident.JoinedAt}, nil
}

// AlreadyJoined is the error of joining a joined box: nothing was done.
type AlreadyJoined struct{ Record *Record }

func (e *AlreadyJoined) Error() string {
	return fmt.Sprintf("already joined as %s: nothing changed (`control leave` first to join again)", e.Record.Machine)
}

// Join makes this box a member with o.Token and returns the record of
// what it wrote. It does not start the units (Start does).
func Join(ctx context.Context, o Options) (*Record, error) {
	if rec, err := Joined(o.Layout); err != nil || rec != nil {
		if err != nil {
			return nil, err
		}
		return nil, &AlreadyJoined{Record: rec}
	}
	p, err := o.prepare()
	if err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp(o.State, ".join-")
	if err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	defer os.RemoveAll(stage)
	rec, err := o.redeem(ctx, p, stage)
	if err != nil {
		return nil, err
	}
	if err := o.commit(p, stage, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// prepared is what Join checked before the invite is spent.
type prepared struct {
	roles    []string
	units    []string
	owner    owner
	caddy    map[string]any // the packaged caddy.json, with Gateway
	agentEnv []byte
}

// prepare checks everything that can be checked before an invite is
// spent, so that a box that cannot be written to spends nothing.
func (o *Options) prepare() (*prepared, error) {
	if !strings.HasPrefix(o.Token, store.InviteTokenPrefix) {
		return nil, store.Errorf(store.CodeInvalid, "not an edgeplane invite token (want the output of `control machine invite`)")
	}
	cas, err := invites.CAs(o.Token)
	if err != nil {
		return nil, err
	}
	if len(cas) == 0 {
		return nil, store.Errorf(store.CodeInvalid, "the invite names no fleet CA: a box joins storage nodes that speak TLS (invite from a CLI whose credentials carry the fleet CA)")
	}
	if o.NATSURL == "" {
		if o.NATSURL, err = invites.StoreURLs(o.Token); err != nil {
			return nil, err
		}
	}
	if o.NATSURL == "" {
		return nil, store.Errorf(store.CodeInvalid, "the invite names no storage node: give them with --nats tls://HOST:4222[,...] (or invite with `control machine invite --store URLS`)")
	}
	if len(o.EnrollAddrs) == 0 {
		o.EnrollAddrs = enroll.DefaultAddrs(o.NATSURL)
	}
	if o.Machine == "" {
		o.Machine = store.DefaultMachineID()
	}
	if !store.ValidToken(o.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: letters, digits, '-' and '_' only", o.Machine).With("machine", o.Machine)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	for _, d := range []string{o.Etc, o.State} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, store.Errorf(store.CodeInvalid, "%s is not a directory: install the edgeplane packages first", d).With("dir", d)
		}
	}
	p := &prepared{roles: []string{storagenode.RoleAgent}, units: []string{UnitAgent}}
	if p.agentEnv, err = os.ReadFile(filepath.Join(o.Etc, "agent.env")); err != nil {
		return nil, store.Errorf(store.CodeInvalid, "the agent's env file: %v (is edgeplane-control installed?)", err)
	}
	if o.Gateway || o.Mesh {
		if o.ServiceUser == "" {
			o.ServiceUser = "edgeplane"
		}
		if p.owner, err = lookupOwner(o.ServiceUser); err != nil {
			return nil, err
		}
	}
	if o.Gateway {
		p.roles, p.units = append(p.roles, storagenode.RoleGateway), append(p.units, UnitGateway)
		b, err := os.ReadFile(filepath.Join(o.Etc, "caddy.json"))
		if err != nil {
			return nil, store.Errorf(store.CodeInvalid, "the gateway's config: %v (is edgeplane-gateway installed?)", err)
		}
		if err := json.Unmarshal(b, &p.caddy); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "%s: %v", filepath.Join(o.Etc, "caddy.json"), err)
		}
	}
	if o.Mesh {
		p.roles, p.units = append(p.roles, storagenode.RoleMesh), append(p.units, UnitMeshd)
		if _, err := node.LoadState(o.meshdDir()); !errors.Is(err, node.ErrNotJoined) {
			return nil, store.Errorf(store.CodeConflict, "%s holds a mesh membership already (`meshd leave --data %s` first)", o.meshdDir(), o.meshdDir())
		}
		if o.MeshMode == "" {
			o.MeshMode = node.ModeTUN
		}
	}
	return p, nil
}

// owner is a user and group to chown to.
type owner struct{ uid, gid int }

func lookupOwner(name string) (owner, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return owner{}, store.Errorf(store.CodeInvalid, "service user %s: %v (the packages' postinst makes it)", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return owner{uid: uid, gid: gid}, nil
}

// rootOwner is who owns the agent's state: whoever runs join (root, on a
// box).
func rootOwner() owner { return owner{uid: os.Geteuid(), gid: os.Getegid()} }

// redeem spends the invite for every role, making everything in stage:
// stage/<role dir>/ mirrors the state dirs, stage/etc the configs.
func (o *Options) redeem(ctx context.Context, p *prepared, stage string) (_ *Record, failed error) {
	creds := filepath.Join(stage, "creds")
	files, err := enroll.Join(ctx, enroll.JoinRequest{Token: o.Token, Machine: o.Machine, Roles: p.roles, Addrs: o.EnrollAddrs, Dir: creds, Timeout: o.Timeout})
	if err != nil {
		return nil, err
	}
	// Once enrolled, the invite is bound to this machine: a failure from
	// here on leaves it half spent, and says so. The keys enrolled go with
	// the staging dir, so the credentials signed for them serve no one.
	spent := func(step string, err error) error {
		cause := store.AsError(err)
		se := store.Errorf(cause.Code, "%s: %s; nothing was written on this box, but the invite is spent for machine %s: join with a new invite "+
			"(after `control machine rm %s` if the control plane lists it)", step, cause.Message, o.Machine, o.Machine)
		for k, v := range cause.Detail {
			se = se.With(k, v)
		}
		return se
	}
	dirs := map[string]string{storagenode.RoleAgent: "agent", storagenode.RoleGateway: "gateway", storagenode.RoleMesh: "meshd"}
	for _, role := range p.roles {
		dir := filepath.Join(stage, dirs[role])
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Rename(files[role], enroll.CredsFile(dir, role)); err != nil {
			return nil, err
		}
	}
	rec := &Record{Machine: o.Machine, NATSURL: o.NATSURL, Roles: p.roles, Units: p.units}
	if o.Mesh {
		dir := filepath.Join(stage, "meshd")
		st, err := node.Join(ctx, node.JoinOptions{Token: o.Token, DataDir: dir, NATSURL: o.NATSURL, CredsFile: enroll.CredsFile(dir, storagenode.RoleMesh),
			Machine: o.Machine, ListenPort: o.MeshPort, Mode: o.MeshMode, Timeout: o.Timeout})
		if err != nil {
			return nil, spent("registering with the mesh", err)
		}
		// meshd keeps its credentials' path: the one they will have.
		st.CredsFile = enroll.CredsFile(o.meshdDir(), storagenode.RoleMesh)
		if err := node.SaveState(dir, st); err != nil {
			return nil, err
		}
		rec.MeshIP = st.MeshIP
		// A join that fails after this takes its mesh peer out again (with
		// the mesh credentials, as `meshd leave` would), so that a new
		// invite for this machine is not refused for a peer it left.
		defer func() {
			if failed != nil {
				lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.Timeout)
				defer cancel()
				_, _ = node.Leave(lctx, node.LeaveOptions{DataDir: dir, CredsFile: enroll.CredsFile(dir, storagenode.RoleMesh), Timeout: o.Timeout})
			}
		}()
	}
	cfg := store.Config{NATSURL: o.NATSURL, CredsFile: enroll.CredsFile(filepath.Join(stage, "agent"), storagenode.RoleAgent)}
	s, err := cfg.Dial(ctx, store.ConnectOptions{Name: "control join " + o.Machine, Timeout: o.Timeout})
	if err != nil {
		return nil, spent("connecting to the store", err)
	}
	defer s.NC.Close()
	m, err := agent.Identify(ctx, s, agent.JoinRequest{DataDir: filepath.Join(stage, "agent"), Token: o.Token, Machine: o.Machine, Advertise: o.Advertise})
	if err != nil {
		return nil, spent("admitting the machine", err)
	}
	rec.Address = m.Address
	etc := filepath.Join(stage, "etc")
	if err := os.MkdirAll(etc, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(etc, "agent.env"), AgentEnv(p.agentEnv, o.NATSURL), 0o600); err != nil {
		return nil, err
	}
	if o.Gateway {
		b, err := GatewayConfig(p.caddy, o.NATSURL, enroll.CredsFile(o.gatewayDir(), storagenode.RoleGateway), o.Machine)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(etc, "caddy.json"), b, 0o600); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// commit moves what redeem staged into place, the join record last: a
// box is joined once that record exists.
func (o *Options) commit(p *prepared, stage string, rec *Record) error {
	moves := []struct {
		from, to string
		owner    owner
	}{
		{filepath.Join(stage, "meshd"), o.meshdDir(), p.owner},
		{filepath.Join(stage, "gateway"), o.gatewayDir(), p.owner},
		// agent.json last of the state: it alone makes the agent start.
		{filepath.Join(stage, "agent"), o.agentDir(), rootOwner()},
	}
	if err := os.MkdirAll(o.packagedDir(), 0o700); err != nil {
		return err
	}
	etc, err := os.ReadDir(filepath.Join(stage, "etc"))
	if err != nil {
		return err
	}
	for _, e := range etc {
		if err := replaceConfig(filepath.Join(stage, "etc", e.Name()), filepath.Join(o.Etc, e.Name()), o.packagedDir()); err != nil {
			return err
		}
		rec.Replaced = append(rec.Replaced, filepath.Join(o.Etc, e.Name()))
	}
	for _, m := range moves {
		entries, err := os.ReadDir(m.from)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := privateDir(m.to, m.owner); err != nil {
			return err
		}
		slices.SortFunc(entries, func(a, b os.DirEntry) int {
			// The agent's identity goes last.
			return boolInt(a.Name() == agent.IdentityFile) - boolInt(b.Name() == agent.IdentityFile)
		})
		for _, e := range entries {
			from, to := filepath.Join(m.from, e.Name()), filepath.Join(m.to, e.Name())
			if err := os.Lchown(from, m.owner.uid, m.owner.gid); err != nil {
				return err
			}
			if err := os.Chmod(from, 0o600); err != nil {
				return err
			}
			if err := os.Rename(from, to); err != nil {
				return fmt.Errorf("putting %s in place: %w", to, err)
			}
			rec.Files = append(rec.Files, to)
		}
	}
	rec.JoinedAt = time.Now().UTC()
	b, _ := json.MarshalIndent(rec, "", "  ")
	return writePrivate(o.recordFile(), b)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// privateDir makes dir (mode 0700) owned by ow, as the unit's
// StateDirectory= would.
func privateDir(dir string, ow owner) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	return os.Lchown(dir, ow.uid, ow.gid)
}
