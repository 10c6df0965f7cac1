package agent

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Instances the store does not know. The store can go back in time (a
// storage node restarted from an older copy, a restored backup, writes a
// power cut took): it then has no record of instances started since, which
// this agent still runs. Nothing routes them (gateways route what the
// store's records and commits name) and no deploy stops them (a deploy
// stops the records it replaces). The agent reports them in its machine
// state (MachineState.Unrecorded), which `control doctor` names, and logs
// them; it keeps them running. It does not stop them on its own: the
// store's view may be the mistake (an older backup restored by hand, to be
// followed by the right one), these may be the only copies of the newest
// revision, and an instance stopped on a guess is data lost without anyone
// deciding it. Stopping one is the operator's call: `control instance
// stop ID --machine M` once the store is confirmed to be the truth.

// recordCheckInterval is how often the agent checks, beside after every
// reconnect to the store (a store that went back in time restarted, so a
// reconnect is when it shows).
const recordCheckInterval = 5 * time.Minute

// recordGrace spares instances started this recently: their record is
// written right after their launch, and may not be in the store yet. A
// variable: tests shorten it.
var recordGrace = 10 * time.Second

// findUnrecorded returns, sorted, the instances the agent runs whose record
// the store does not hold, and how many it spared for their youth. A record
// it could not read stops the check: the caller keeps what it knew and asks
// again later.
func (a *Agent) findUnrecorded(ctx context.Context) (ids []string, spared int, err error) {
	var recs []store.InstanceRecord
	now := time.Now()
	a.locked(func() {
		for _, inst := range a.instances {
			switch {
			case inst.stopping:
			case now.Sub(inst.Record.CreatedAt) < recordGrace:
				spared++
			default:
				recs = append(recs, inst.Record)
			}
		}
	})
	for _, rec := range recs {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _, err := a.cfg.Store.GetInstance(gctx, rec.Key())
		cancel()
		switch {
		case store.HasCode(err, store.CodeNotFound):
			// Still ours? An instance stopped meanwhile is not news.
			if _, ok := a.lookup(rec.ID); ok {
				ids = append(ids, rec.ID)
			}
		case err != nil:
			return nil, 0, err
		}
	}
	slices.Sort(ids)
	return ids, spared, nil
}

// checkRecords updates the unrecorded instances the machine state reports,
// and says so when they change. It returns whether the check must be done
// again at the next beat: it failed, or spared instances for their youth
// (started just before a rewind, they would be missed until the next
// periodic check).
func (a *Agent) checkRecords(ctx context.Context) (again bool) {
	ids, spared, err := a.findUnrecorded(ctx)
	if err != nil {
		a.log.Debug("checking the store's instance records", zap.Error(err))
		return true
	}
	var was []string
	if p := a.unrecorded.Load(); p != nil {
		was = *p
	}
	if slices.Equal(was, ids) {
		return spared > 0
	}
	a.unrecorded.Store(&ids)
	if len(ids) > 0 {
		a.log.Error("this machine runs instances the store has no record of: the store may have gone back in time "+
			"(a restored backup, a power cut); nothing routes them, they keep running until stopped "+
			"(control doctor names them; control instance stop ID --machine M)",
			zap.Strings("instances", ids))
	} else if len(was) > 0 {
		a.log.Info("every instance this machine runs has a record in the store again")
	}
	return spared > 0
}

// unrecordedLocked is what the machine state reports: of the instances the
// last check found unrecorded, those the agent still runs (one stopped
// since is gone from the report at once). The caller holds mu.
func (a *Agent) unrecordedLocked() []string {
	p := a.unrecorded.Load()
	if p == nil {
		return nil
	}
	var out []string
	for _, id := range *p {
		if _, ok := a.instances[id]; ok {
			out = append(out, id)
		}
	}
	return out
}
