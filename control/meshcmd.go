package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store"
)

// rotation is one node's key rotation as `control mesh rotate` reports it.
type rotation struct {
	Machine     string    `json:"machine"`
	RequestedAt time.Time `json:"requested_at"`
	// Rotated: the node registered a new key after the request.
	Rotated       bool      `json:"rotated"`
	PublicKey     string    `json:"public_key"`
	PreviousKey   string    `json:"previous_key,omitempty"`
	PreviousUntil time.Time `json:"previous_until,omitempty"`
}

func setupMeshRotate(fs *flag.FlagSet) func(*call) error {
	machine := fs.String("machine", "", "rotate this machine's key (default: every meshd node's)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the nodes to register their new keys (0: ask and return)")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			reg, err := registrar.New(s, registrar.Config{})
			if err != nil {
				return err
			}
			var targets []string
			if *machine != "" {
				targets = []string{*machine}
			} else {
				peers, err := s.MeshPeerList(c.ctx)
				if err != nil {
					return err
				}
				for _, p := range peers {
					if !p.Static {
						targets = append(targets, p.Machine)
					}
				}
				sort.Strings(targets)
			}
			out := make([]rotation, 0, len(targets))
			for _, m := range targets {
				rec, err := reg.RequestRotation(c.ctx, m)
				if err != nil {
					return fmt.Errorf("asking %s to rotate: %w", m, err)
				}
				out = append(out, rotation{Machine: m, RequestedAt: rec.RotateRequested, PublicKey: rec.PublicKey})
			}
			pending := len(out)
			deadline := time.Now().Add(*wait)
			for pending > 0 && time.Now().Before(deadline) {
				select {
				case <-c.ctx.Done():
					return c.ctx.Err()
				case <-time.After(250 * time.Millisecond):
				}
				pending = 0
				for i := range out {
					if out[i].Rotated {
						continue
					}
					rec, err := s.MeshPeer(c.ctx, out[i].Machine)
					if err != nil {
						return err
					}
					if rec.KeyAge().After(out[i].RequestedAt) {
						out[i].Rotated, out[i].PublicKey = true, rec.PublicKey
						out[i].PreviousKey, out[i].PreviousUntil = rec.PreviousKey, rec.PreviousUntil
					} else {
						pending++
					}
				}
			}
			err = c.out.emit(out, func(w io.Writer) {
				for _, r := range out {
					if r.Rotated {
						fmt.Fprintf(w, "%s  rotated: new key %s; the old key is accepted until %s\n", r.Machine, r.PublicKey,
							r.PreviousUntil.Local().Format(time.RFC3339))
					} else {
						fmt.Fprintf(w, "%s  asked: the node rotates when it sees the request (it must be running and connected)\n", r.Machine)
					}
				}
			})
			if err != nil {
				return err
			}
			if pending > 0 && *wait > 0 {
				return fmt.Errorf("%d of %d nodes did not rotate within %s; they still will once running and connected", pending, len(out), *wait)
			}
			return nil
		})
	}
}
