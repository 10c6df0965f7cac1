// Package regions holds the control plane's rules for a region as a unit.
// The store carries a region's state (store.RegionRecord, a signed routing
// event) and gateways and DNS act on it; the decisions others act on are
// made here:
//
//   - which regions exist (Known): every region a machine is in and every
//     region a record names; anything else is store.ErrUnknownRegion,
//     refused before anything is written (Check);
//   - what an operator's state change publishes (Set): one region event,
//     signed with the CLI's signer, nothing for an unknown region, nothing
//     for the state the region already has;
//   - what a region's state means for placement (PlacementState): a
//     machine in a draining region is placed on as a draining machine, in
//     a disabled region as a disabled one;
//   - what `control region ls` shows (Read): each region's state, who set
//     it and when, its machines by state, their instances and the gateways
//     in it.
package regions

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// Known returns the sorted names of the regions the fleet knows: those
// machines are in and those records name (a region whose machines all
// left keeps its record, and its state).
func Known(machines map[string]store.MachineRecord, records map[string]store.RegionRecord) []string {
	set := map[string]bool{}
	for _, m := range machines {
		if m.Region != "" {
			set[m.Region] = true
		}
	}
	for name := range records {
		set[name] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// Check is nil when region is one of known, else store.ErrUnknownRegion
// naming the known ones.
func Check(region string, known []string) error {
	if slices.Contains(known, region) {
		return nil
	}
	return store.ErrUnknownRegion(region, known)
}

// StateOf is the state of region in records: active when no record names
// it (and for a machine without a region).
func StateOf(records map[string]store.RegionRecord, region string) string {
	if r, ok := records[region]; ok && region != "" {
		return r.State
	}
	return store.RegionActive
}

// PlacementState is the state placement treats a machine in state
// machineState as, in a region in regionState: the stricter of the two,
// so a region is drained or disabled exactly as each of its machines would
// be (`control machine drain|disable`).
func PlacementState(machineState, regionState string) string {
	switch {
	case machineState == store.MachineDisabled || regionState == store.RegionDisabled:
		return store.MachineDisabled
	case machineState == store.MachineDraining || regionState == store.RegionDraining:
		return store.MachineDraining
	}
	return machineState
}

// Read reads the machines and the region records, each record verified.
func Read(ctx context.Context, s *store.Store) (map[string]store.MachineRecord, map[string]store.RegionRecord, error) {
	machines := map[string]store.MachineRecord{}
	if err := s.ListMachines(ctx, func(m *store.MachineRecord) error {
		machines[m.ID] = *m
		return nil
	}); err != nil {
		return nil, nil, err
	}
	records, err := s.RegionRecords(ctx)
	if err != nil {
		return nil, nil, err
	}
	return machines, records, nil
}

// Change is what a state change did.
type Change struct {
	Region store.RegionRecord `json:"region"`
	// Previous is the state the region had; Changed is false when it had
	// the state asked for already, and nothing was published.
	Previous string `json:"previous"`
	Changed  bool   `json:"changed"`
	// Seq is the routing sequence of the event that carries the state
	// (0 when nothing was published).
	Seq uint64 `json:"seq,omitempty"`
	// Gateways is, after a wait, how many live gateways applied Seq
	// ("2/3"); Laggards are those that had not when the wait ended.
	Gateways string   `json:"gateways,omitempty"`
	Laggards []string `json:"laggards,omitempty"`
}

// Set sets region's state, published as a signed routing event; with
// wait > 0 it then waits, at most wait, for every live gateway to apply
// it. An unknown region is refused and nothing is published.
func Set(ctx context.Context, s *store.Store, region, state string, wait time.Duration) (*Change, error) {
	if !store.ValidRegionState(state) {
		return nil, store.Errorf(store.CodeInvalid, "unknown region state %q (want %s, %s or %s)", state,
			store.RegionActive, store.RegionDraining, store.RegionDisabled).With("state", state)
	}
	machines, records, err := Read(ctx, s)
	if err != nil {
		return nil, err
	}
	if err := Check(region, Known(machines, records)); err != nil {
		return nil, err
	}
	ch := &Change{Previous: StateOf(records, region)}
	if ch.Previous == state {
		ch.Region = records[region]
		ch.Region.Name, ch.Region.State = region, state
		return ch, nil
	}
	if err := gatewaysReadRegions(ctx, s); err != nil {
		return nil, err
	}
	ch.Region = store.RegionRecord{Name: region, State: state, By: store.Operator(), UpdatedAt: time.Now().UTC()}
	if ch.Seq, err = s.SetRegionState(ctx, ch.Region); err != nil {
		return nil, err
	}
	ch.Changed = true
	if wait > 0 {
		serving, total, laggards := routing.WaitApplied(ctx, s, ch.Seq, wait)
		ch.Gateways, ch.Laggards = fraction(serving, total), laggards
	}
	return ch, nil
}

// gatewaysReadRegions refuses to set a region's state, with version_skew,
// while a live gateway announces a generation before regions: it would
// refuse the event as one it cannot read, and serve the region as before.
func gatewaysReadRegions(ctx context.Context, s *store.Store) error {
	return routing.RefuseGatewaysBelow(ctx, s, store.GenerationRegions, "read region states")
}
