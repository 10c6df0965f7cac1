package fleet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Process kinds, as they announce themselves.
const (
	KindControl = "control server"
	KindAgent   = "agent"
	KindGateway = "gateway"
	KindMesh    = "meshd"
)

// Process is one running process of the fleet as it announces itself:
// a control server by its ServerRecord, an agent by its heartbeat, a
// gateway by its routing report, a meshd by its mesh heartbeat.
// Generation is what it announced or, for a process of a release before
// announcements, the oldest it may be (store.GenerationOf); Announced
// says which.
type Process struct {
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Release    string `json:"release"`
	Generation int    `json:"generation"`
	Announced  bool   `json:"announced"`
}

// Processes reads every process that is still heard from: control servers
// whose record is fresh, machines whose agent or meshd has not gone
// offline, gateways whose report has not aged out. A control server of a
// release before announcements writes no record and is not among them.
func Processes(ctx context.Context, s *store.Store) ([]Process, error) {
	now := time.Now()
	var out []Process
	add := func(kind, name, release string, gen int) {
		out = append(out, Process{Kind: kind, Name: name, Release: cmp.Or(release, "unknown"),
			Generation: store.GenerationOf(gen, release), Announced: gen > 0})
	}
	if err := s.ListServerRecords(ctx, func(r *store.ServerRecord) error {
		if r.Fresh(now) {
			add(KindControl, r.Name, r.Release, r.Generation)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the control servers' announcements: %w", err)
	}
	if err := s.ListMachineBeats(ctx, func(b *store.MachineBeat) error {
		if b.Liveness(now) != store.MachineOffline {
			add(KindAgent, b.Machine, b.Release, b.Generation)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the agents' heartbeats: %w", err)
	}
	if err := s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		if now.Sub(g.At) < store.GatewayObservationTTL {
			add(KindGateway, g.Gateway, g.Release, g.Generation)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the gateways' reports: %w", err)
	}
	beats, err := s.MeshHeartbeats(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the mesh heartbeats: %w", err)
	}
	for _, hb := range beats {
		if hb.Liveness(now) != store.LivenessOffline {
			add(KindMesh, hb.Machine, hb.Release, hb.Generation)
		}
	}
	slices.SortFunc(out, func(a, b Process) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}

// Lowest is the lowest generation among ps, and the processes at it; with
// none, SchemaGeneration (nothing heard from is older than this build).
func Lowest(ps []Process) (int, []Process) {
	low := store.SchemaGeneration
	for _, p := range ps {
		low = min(low, p.Generation)
	}
	var at []Process
	for _, p := range ps {
		if p.Generation == low {
			at = append(at, p)
		}
	}
	return low, at
}
