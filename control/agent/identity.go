package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// Identity is what an agent saves in its data dir when it joins, so that
// later starts need only the data dir.
type Identity struct {
	Machine  string    `json:"machine"`
	Address  string    `json:"address"`
	JoinedAt time.Time `json:"joined_at"`
}

// IdentityFile is the identity's file in an agent's data dir.
const IdentityFile = "agent.json"

// JoinRequest is how `control agent` names its machine.
type JoinRequest struct {
	// DataDir holds the saved identity.
	DataDir string
	// Token is an invite from `control machine invite`, needed once: the
	// first start joins with it, later ones start from the saved identity.
	Token string
	// Machine is the machine's ID; default: the saved one, else the
	// hostname. A data dir of another machine is refused.
	Machine string
	// Advertise is the IP instances listen on and are reached at; default:
	// the saved one, else the machine's mesh IP (once its meshd
	// registered), else 127.0.0.1.
	Advertise string
}

// Identify resolves the machine this agent serves: joining with the
// invite token once (the control plane records the machine; the agent may
// not write machine records itself), then from the identity saved in the
// data dir, asking the control plane to record a new address when
// Advertise changed it. Every refusal is a structured error: invalid for a
// bad address, not_found for a data dir that never joined, conflict for a
// data dir of another machine.
func Identify(ctx context.Context, s *store.Store, req JoinRequest) (*store.MachineRecord, error) {
	if err := os.MkdirAll(req.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("agent data dir: %w", err)
	}
	path := filepath.Join(req.DataDir, IdentityFile)
	var ident Identity
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &ident); err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("reading agent identity: %w", err)
	}
	if req.Token == "" {
		return rejoin(ctx, s, req, ident)
	}
	// A box that joined already (an agent restarted with --join) starts
	// from its identity: an invite admits once. Only a machine that was
	// removed since joins again with the (new) invite.
	if ident.Machine != "" && (req.Machine == "" || req.Machine == ident.Machine) {
		rec, err := rejoin(ctx, s, req, ident)
		if !store.HasCode(err, store.CodeNotFound) {
			return rec, err
		}
	}
	id := req.Machine
	if id == "" {
		id = ident.Machine
	}
	if id == "" {
		id = store.DefaultMachineID()
	}
	addr, err := advertiseAddr(req.Advertise, ident.Address, meshIP(ctx, s, id))
	if err != nil {
		return nil, err
	}
	rec, err := machines.RequestAdmission(ctx, s, machines.AdmitJoin, machines.AdmissionRequest{Machine: id, Token: req.Token, Address: addr})
	if err != nil {
		return nil, err
	}
	ident = Identity{Machine: rec.ID, Address: rec.Address, JoinedAt: rec.JoinedAt}
	b, _ = json.MarshalIndent(ident, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("saving agent identity: %w", err)
	}
	return rec, nil
}

// rejoin starts from the saved identity.
func rejoin(ctx context.Context, s *store.Store, req JoinRequest, ident Identity) (*store.MachineRecord, error) {
	if ident.Machine == "" {
		return nil, store.Errorf(store.CodeNotFound, "this data dir has no machine identity; join first with --join TOKEN (from `control machine invite`)").
			With("data", req.DataDir)
	}
	if req.Machine != "" && req.Machine != ident.Machine {
		return nil, store.Errorf(store.CodeConflict, "data dir belongs to machine %s, not %s", ident.Machine, req.Machine)
	}
	rec, err := machines.Get(ctx, s, ident.Machine)
	if err != nil {
		return nil, err
	}
	if req.Advertise == "" || req.Advertise == rec.Address {
		return rec, nil
	}
	if net.ParseIP(req.Advertise) == nil {
		return nil, badAdvertise(req.Advertise)
	}
	return machines.RequestAdmission(ctx, s, machines.AdmitAddress, machines.AdmissionRequest{Machine: rec.ID, Address: req.Advertise})
}

// meshIP is machine's mesh IP if meshd registered it, else "".
func meshIP(ctx context.Context, s *store.Store, machine string) string {
	if peer, err := s.MeshPeer(ctx, machine); err == nil {
		return peer.MeshIP
	}
	return ""
}

// advertiseAddr picks the first of the flag, the saved address and the mesh
// IP that is set, else loopback.
func advertiseAddr(flagVal, saved, mesh string) (string, error) {
	v := "127.0.0.1"
	for _, c := range []string{mesh, saved, flagVal} {
		if c != "" {
			v = c
		}
	}
	if net.ParseIP(v) == nil {
		return "", badAdvertise(v)
	}
	return v, nil
}

// ErrBadAdvertise is an advertised address that is not an IP.
var ErrBadAdvertise = errors.New("not an IP address")

func badAdvertise(v string) error {
	return store.Errorf(store.CodeInvalid, "--advertise %q: %w", v, ErrBadAdvertise).With("advertise", v)
}
