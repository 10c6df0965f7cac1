package deploy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// Step 3 of an apply: probe the machines it means to use and place the
// new slots on those that answered.

// probeAndPlace places the new slots and asks only the machines it means
// to use (and those that run kept instances) for their live capacity.
// Candidates come from what agents last wrote of their machines (fresh
// heartbeat, free slots); a machine that fails its probe, or has less room
// than it said, is set aside and the slots are placed again, a few rounds
// at most. A machine without any heartbeat (an older agent) is a candidate
// too: its probe decides. Nothing is written here.
func (r *run) probeAndPlace(ctx context.Context) error {
	d := r.d
	states, beats, err := r.st.observations(ctx, d.s)
	if err != nil {
		return err
	}
	now := time.Now()
	keep := map[string]bool{}
	for _, a := range r.plan.Actions {
		if a.Action == ActionKeep {
			keep[a.Machine] = true
		}
	}
	probed := map[string]*store.CapacityReply{}
	down := map[string]error{}
	var downList []string
	for round := 0; ; round++ {
		var cands []*candidate
		for _, id := range slices.Sorted(maps.Keys(r.st.machines)) {
			m := r.st.machines[id]
			if _, gone := down[id]; gone || m.State != store.MachineActive {
				continue
			}
			c := &candidate{rec: m, perService: map[string]int{}}
			switch rep, st := probed[id], states[id]; {
			case rep != nil:
				c.free, c.load, c.noEngine = rep.Free, rep.Instances, !slices.Contains(rep.Drivers, "container")
			case beats[id].Machine == "":
				// Never beat: no observation to go by; its probe decides.
				c.free = 1 << 30
			default:
				if b := beats[id]; b.Liveness(now) != store.MachineFresh {
					continue
				}
				c.free, c.load, c.noEngine = st.Free, st.Instances, st.Machine != "" && !slices.Contains(st.Drivers, "container")
				if st.Machine == "" {
					c.free = 1 << 30
				}
			}
			cands = append(cands, c)
		}
		if err := place(r.plan, cands); err != nil {
			if len(downList) > 0 {
				store.AsError(err).With("unavailable", strings.Join(downList, "; "))
			}
			return err
		}
		want := map[string]int{}
		for _, a := range r.plan.Actions {
			if a.Action == ActionStart {
				want[a.Machine]++
			}
		}
		var ask []string
		for id := range keep {
			if probed[id] == nil {
				ask = append(ask, id)
			}
		}
		for id := range want {
			if probed[id] == nil && !keep[id] {
				ask = append(ask, id)
			}
		}
		sort.Strings(ask)
		short := false
		for i, p := range machines.Probe(ctx, d.s, ask, d.opts.ProbeTimeout) {
			id := ask[i]
			if p.Err != nil {
				// A machine that runs a kept instance is required: without
				// it the new commit would route to a machine nobody can
				// vouch for.
				if keep[id] {
					return p.Err
				}
				down[id] = p.Err
				downList = append(downList, fmt.Sprintf("%s (%v)", id, p.Err))
				short = true
				continue
			}
			probed[id] = p.Reply
			if p.Reply.Free < want[id] {
				short = true // it has less room than it said: place again with the truth
			}
		}
		if !short {
			break
		}
		if round == 3 {
			return store.Errorf(store.CodeUnavailable, "placement did not settle: machines kept failing their probes").
				With("unavailable", strings.Join(downList, "; "))
		}
	}
	msg := fmt.Sprintf("%d machines asked, %d answered", len(probed)+len(down), len(probed))
	if len(downList) > 0 {
		msg += "; not used: " + strings.Join(downList, "; ")
	}
	d.step(StepProbe, "%s", msg)
	return nil
}
