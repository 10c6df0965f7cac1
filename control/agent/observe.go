package agent

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// observe writes the machine's heartbeat every BeatInterval, its state
// (what it runs and can take) whenever that changed, and its instance
// observations again after a write of them failed, and all three at once
// after a reconnect, until the agent stops. The control plane reads these
// instead of asking every machine.
func (a *Agent) observe(ctx context.Context) {
	t := time.NewTicker(a.cfg.BeatInterval)
	defer t.Stop()
	started := time.Now().UTC()
	var written *store.MachineState
	failing := false
	note := func(err error) {
		switch {
		case err != nil && !failing:
			a.log.Warn("machine heartbeat, state or observations not written (retried)", zap.Error(err))
		case err == nil && failing:
			a.log.Info("machine heartbeat, state and observations written again")
		}
		failing = err != nil
	}
	writeState := func() {
		st := a.machineState(started)
		if written != nil && sameState(written, st) {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := a.cfg.Store.PutMachineState(wctx, st)
		if err == nil {
			written = st
			a.observed.Store(true)
		}
		note(err)
	}
	// The first write replaces what a previous agent observed; later
	// ones retry a change whose write failed (note).
	writeObservations := func(always bool) {
		if !always && !a.observations.Behind() {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := a.observations.Flush(wctx)
		note(err)
	}
	beat := func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		note(a.cfg.Store.PutMachineBeat(wctx, a.cfg.Machine.ID, a.cfg.BeatInterval))
	}
	// After a reconnect the store may be an older one (it went back in
	// time): at once, the beat, state and observations are written again
	// whatever this agent last wrote (a rewound beat would keep the
	// machine out of deploys until the next), and its instances' records
	// are checked. The first beat checks too: a restarted agent adopted
	// what it ran.
	reconnects := a.cfg.Store.NC.Stats().Reconnects
	var checked time.Time
	recheck := false
	check := func(again bool) {
		if again {
			written = nil
		}
		recheck = a.checkRecords(ctx)
		checked = time.Now()
		writeState()
		writeObservations(again)
	}
	rt := time.NewTicker(reconnectPoll)
	defer rt.Stop()
	beat()
	writeState()
	writeObservations(true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.quit:
			return
		case <-rt.C:
			if r := a.cfg.Store.NC.Stats().Reconnects; r != reconnects {
				reconnects = r
				beat()
				check(true)
			}
		case <-t.C:
			beat()
			if recheck || time.Since(checked) >= recordCheckInterval {
				check(false)
				continue
			}
			writeState()
			writeObservations(false)
		case <-a.stateKick:
			writeState()
		}
	}
}

// reconnectPoll is how often observe looks for a reconnect to the store.
const reconnectPoll = 250 * time.Millisecond

// kickState asks observe to write the machine state now.
func (a *Agent) kickState() {
	select {
	case a.stateKick <- struct{}{}:
	default:
	}
}

func (a *Agent) machineState(started time.Time) *store.MachineState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &store.MachineState{Machine: a.cfg.Machine.ID, Instances: len(a.instances), ByState: map[string]int{},
		Capacity: a.cfg.MaxInstances, Free: max(0, a.cfg.MaxInstances-len(a.instances)), Drivers: a.drivers(),
		Restarts: a.restarts.Load(), StartedAt: started, Release: version.Version, Arch: version.Arch(), Upgrade: a.upgradeStatus.Load(),
		Unrecorded: a.unrecordedLocked()}
	for _, inst := range a.instances {
		st.ByState[string(inst.Record.State)]++
	}
	return st
}

func sameState(a, b *store.MachineState) bool {
	return a.Instances == b.Instances && a.Free == b.Free && a.Capacity == b.Capacity && a.Restarts == b.Restarts &&
		maps.Equal(a.ByState, b.ByState) && slices.Equal(a.Drivers, b.Drivers) && a.Upgrade == b.Upgrade &&
		slices.Equal(a.Unrecorded, b.Unrecorded)
}
