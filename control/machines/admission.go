package machines

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Admission verbs: what an agent may ask of the control plane about its
// own machine record. An agent never writes a machine record (its region,
// labels and state are the operator's): it asks, and the control plane
// checks the request against the subject its credentials bind it to.
const (
	// AdmitJoin redeems an invite and records the machine.
	AdmitJoin = "join"
	// AdmitAddress moves the machine to another address.
	AdmitAddress = "address"
)

// AdmissionRequest is an agent's join or address change.
type AdmissionRequest struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	Token   string `json:"token,omitempty"`
	Address string `json:"address"`
}

// ServeAdmission answers agents' admission requests until ctx ends or the
// returned stop is called; every control server runs it.
func ServeAdmission(ctx context.Context, s *store.Store) (func(), error) {
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
			if net.ParseIP(req.Address) == nil {
				return nil, store.Errorf(store.CodeInvalid, "address %q is not an IP address", req.Address).With("machine", machine)
			}
			switch verb {
			case AdmitJoin:
				return Admit(ctx, s, req.Token, machine, req.Address)
			case AdmitAddress:
				return move(ctx, s, machine, req.Address)
			}
			return nil, store.Errorf(store.CodeInvalid, "unknown admission request %q", verb)
		})
}

// move changes a member machine's address; it admits no one.
func move(ctx context.Context, s *store.Store, id, address string) (*store.MachineRecord, error) {
	cur, rev, err := s.GetMachine(ctx, id)
	if err != nil {
		return nil, err
	}
	if cur.Address == address {
		return cur, nil
	}
	cur.Address, cur.UpdatedAt = address, time.Now().UTC()
	return cur, update(ctx, s, cur, rev)
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
