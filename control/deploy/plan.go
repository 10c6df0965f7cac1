package deploy

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// Slot actions of a plan.
const (
	ActionStart = "start"
	ActionKeep  = "keep"
	ActionStop  = "stop"
)

// SlotAction is what the plan does with one slot.
type SlotAction struct {
	Action     string `json:"action"`
	Service    string `json:"service"`
	Slot       int    `json:"slot"`
	InstanceID string `json:"instance_id,omitempty"`
	Machine    string `json:"machine,omitempty"`
	Revision   int64  `json:"revision"`
	SpecHash   string `json:"spec_hash,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// Plan is the preview of an apply: derived from the manifest and stored
// intent and status only.
type Plan struct {
	Namespace string          `json:"namespace"`
	Revision  int64           `json:"revision"`
	LiveID    string          `json:"live_deploy,omitempty"`
	Actions   []SlotAction    `json:"actions"`
	Manifest  *store.Manifest `json:"-"`
}

// Counts returns how many slots start, keep and stop.
func (p *Plan) Counts() (start, keep, stop int) {
	for _, a := range p.Actions {
		switch a.Action {
		case ActionStart:
			start++
		case ActionKeep:
			keep++
		case ActionStop:
			stop++
		}
	}
	return
}

// candidate is a machine that may take new instances, with what it can take.
type candidate struct {
	rec  store.MachineRecord
	free int
	load int
	// noEngine is set for a machine that said it has no container engine.
	noEngine bool
	// perService counts instances of each service placed on it.
	perService map[string]int
}

// buildPlan decides start/keep/stop per slot from the manifest, the live
// commit (nil for a new namespace), the namespace's instance records and the
// stored machines.
func buildPlan(m *store.Manifest, live *store.DeployCommit, insts map[string]*store.InstanceRecord,
	machines map[string]store.MachineRecord) *Plan {
	p := &Plan{Namespace: m.Namespace, Revision: 1, Manifest: m}
	if live != nil {
		p.Revision = live.Revision + 1
		p.LiveID = live.ID
	}
	liveSlots := map[string]store.SlotAssignment{}
	if live != nil {
		for _, s := range live.Slots {
			liveSlots[s.Service+"/"+strconv.Itoa(s.Slot)] = s
		}
	}
	claimed := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		spec := m.Services[name]
		hash := manifest.SpecHash(spec)
		// Every slot of the live commit runs the live spec (started with
		// it, or kept because it hashed the same), so comparing the two
		// specs decides for all of them, whatever hash an older release
		// recorded for a slot (one that hashed the routes too).
		sameAsLive := false
		if live != nil {
			if ls, ok := live.Manifest.Services[name]; ok {
				sameAsLive = manifest.SpecHash(ls) == hash
			}
		}
		for slot := 0; slot < spec.ReplicaCount(); slot++ {
			old, had := liveSlots[name+"/"+strconv.Itoa(slot)]
			a := SlotAction{Service: name, Slot: slot, Revision: p.Revision, SpecHash: hash}
			switch {
			case !had:
				a.Action, a.Reason = ActionStart, "new slot"
			case old.SpecHash != hash && !sameAsLive:
				a.Action, a.Reason = ActionStart, "spec changed"
			default:
				inst := insts[old.InstanceID]
				mach, known := machines[old.Machine]
				switch {
				case !routing.Routable(inst, old):
					a.Action, a.Reason = ActionStart, "instance not routable"
				case !known || mach.State == store.MachineDisabled:
					a.Action, a.Reason = ActionStart, "machine "+old.Machine+" disabled or removed"
					if known && mach.Region != "" {
						a.Reason += " (or its region " + mach.Region + " disabled)"
					}
				default:
					a.Action, a.InstanceID, a.Machine, a.Revision = ActionKeep, old.InstanceID, old.Machine, old.Revision
					a.Reason = "unchanged"
					claimed[old.InstanceID] = true
				}
			}
			p.Actions = append(p.Actions, a)
		}
	}
	// Everything of the namespace that the new commit does not keep stops:
	// replaced and removed slots, and leftovers of interrupted deploys.
	var stops []SlotAction
	for id, inst := range insts {
		if claimed[id] {
			continue
		}
		reason := "not in the new commit"
		if s, ok := liveSlots[inst.Service+"/"+strconv.Itoa(inst.Slot)]; ok && s.InstanceID == id {
			reason = "replaced"
			if _, still := m.Services[inst.Service]; !still {
				reason = "service removed"
			} else if inst.Slot >= m.Services[inst.Service].ReplicaCount() {
				reason = "slot removed"
			}
		}
		stops = append(stops, SlotAction{Action: ActionStop, Service: inst.Service, Slot: inst.Slot,
			InstanceID: id, Machine: inst.Machine, Revision: inst.Revision, Reason: reason})
	}
	sort.Slice(stops, func(i, j int) bool {
		if stops[i].Service != stops[j].Service {
			return stops[i].Service < stops[j].Service
		}
		if stops[i].Slot != stops[j].Slot {
			return stops[i].Slot < stops[j].Slot
		}
		return stops[i].InstanceID < stops[j].InstanceID
	})
	p.Actions = append(p.Actions, stops...)
	return p
}

// place assigns a machine to every start action, spreading each service
// across machines first and load second. It fails, before anything is
// written, when a service's placement cannot be met.
func place(p *Plan, cands []*candidate) error {
	sort.Slice(cands, func(i, j int) bool { return cands[i].rec.ID < cands[j].rec.ID })
	for _, a := range p.Actions {
		if a.Action == ActionKeep {
			for _, c := range cands {
				if c.rec.ID == a.Machine {
					c.perService[a.Service]++
				}
			}
		}
	}
	for i := range p.Actions {
		a := &p.Actions[i]
		if a.Action != ActionStart {
			continue
		}
		spec := p.Manifest.Services[a.Service]
		var best *candidate
		for _, c := range cands {
			if !eligible(c.rec, spec.Placement) || c.free <= 0 || (spec.Image != "" && c.noEngine) {
				continue
			}
			if best == nil || c.perService[a.Service] < best.perService[a.Service] ||
				c.perService[a.Service] == best.perService[a.Service] && c.load < best.load {
				best = c
			}
		}
		if best == nil {
			e := store.Errorf(store.CodeUnavailable, "no reachable active machine can run %s.%s slot %d", p.Namespace, a.Service, a.Slot).
				With("service", a.Service)
			if len(spec.Placement.Regions) > 0 {
				e.With("regions", strings.Join(spec.Placement.Regions, ","))
			}
			if spec.Image != "" {
				e.With("needs", "a container engine")
			}
			if len(spec.Placement.Labels) > 0 {
				e.With("labels", fmt.Sprint(spec.Placement.Labels))
			}
			return e
		}
		a.Machine = best.rec.ID
		a.InstanceID = newInstanceID(a.Service, a.Slot)
		best.free--
		best.load++
		best.perService[a.Service]++
	}
	return nil
}

func eligible(m store.MachineRecord, pl store.Placement) bool {
	if m.State != store.MachineActive {
		return false
	}
	if len(pl.Regions) > 0 {
		ok := false
		for _, r := range pl.Regions {
			ok = ok || r == m.Region
		}
		if !ok {
			return false
		}
	}
	for k, v := range pl.Labels {
		if m.Labels[k] != v {
			return false
		}
	}
	return true
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newDeployID is time-ordered, so sorting IDs sorts deploys.
func newDeployID() string {
	return "d" + strconv.FormatInt(time.Now().UnixMilli(), 36) + randHex(3)
}

func newInstanceID(service string, slot int) string {
	return fmt.Sprintf("%s-%d-%s", service, slot, randHex(3))
}
