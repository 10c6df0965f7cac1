// Package meshkeys is the operator's rotation of meshd nodes' WireGuard
// keys: it asks each node through the registrar, then waits until each
// registered a new key. Peers accept a node's old key for an overlap
// (meshd/registrar), so no tunnel drops while the nodes rotate.
package meshkeys

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store"
)

// Rotation is one node's key rotation.
type Rotation struct {
	Machine     string    `json:"machine"`
	RequestedAt time.Time `json:"requested_at"`
	// Rotated: the node registered a new key after the request.
	Rotated       bool      `json:"rotated"`
	PublicKey     string    `json:"public_key"`
	PreviousKey   string    `json:"previous_key,omitempty"`
	PreviousUntil time.Time `json:"previous_until,omitempty"`
}

// pollEvery is how often Rotate reads the nodes' registrations while it
// waits.
const pollEvery = 250 * time.Millisecond

// Rotate asks machine's meshd node, or every meshd node that is not a
// static peer when machine is "", for a new key and waits up to wait for
// them to register it (0: asks and returns). pending counts the nodes that
// did not rotate in time; they still will once running and connected.
func Rotate(ctx context.Context, s *store.Store, machine string, wait time.Duration) (rots []Rotation, pending int, err error) {
	reg, err := registrar.New(s, registrar.Config{})
	if err != nil {
		return nil, 0, err
	}
	var targets []string
	if machine != "" {
		targets = []string{machine}
	} else {
		peers, err := s.MeshPeerList(ctx)
		if err != nil {
			return nil, 0, err
		}
		for _, p := range peers {
			if !p.Static {
				targets = append(targets, p.Machine)
			}
		}
		sort.Strings(targets)
	}
	rots = make([]Rotation, 0, len(targets))
	for _, m := range targets {
		rec, err := reg.RequestRotation(ctx, m)
		if err != nil {
			return nil, 0, fmt.Errorf("asking %s to rotate: %w", m, err)
		}
		rots = append(rots, Rotation{Machine: m, RequestedAt: rec.RotateRequested, PublicKey: rec.PublicKey})
	}
	pending = len(rots)
	deadline := time.Now().Add(wait)
	for pending > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(pollEvery):
		}
		pending = 0
		for i := range rots {
			if rots[i].Rotated {
				continue
			}
			rec, err := s.MeshPeer(ctx, rots[i].Machine)
			if err != nil {
				return nil, 0, err
			}
			if rec.KeyAge().After(rots[i].RequestedAt) {
				rots[i].Rotated, rots[i].PublicKey = true, rec.PublicKey
				rots[i].PreviousKey, rots[i].PreviousUntil = rec.PreviousKey, rec.PreviousUntil
			} else {
				pending++
			}
		}
	}
	return rots, pending, nil
}

// WriteText writes each node's rotation, or that it was asked, for a
// person.
func WriteText(w io.Writer, rots []Rotation) {
	for _, r := range rots {
		if r.Rotated {
			fmt.Fprintf(w, "%s  rotated: new key %s; the old key is accepted until %s\n", r.Machine, r.PublicKey,
				r.PreviousUntil.Local().Format(time.RFC3339))
		} else {
			fmt.Fprintf(w, "%s  asked: the node rotates when it sees the request (it must be running and connected)\n", r.Machine)
		}
	}
}
