package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

// checkMachines asks every machine's agent what it runs and compares it
// with the instance records filed under that machine.
func (d *doctor) checkMachines(ctx context.Context) error {
	byMachine := map[string][]*store.InstanceRecord{}
	for _, id := range slices.Sorted(maps.Keys(d.insts)) {
		rec := d.insts[id]
		byMachine[rec.Machine] = append(byMachine[rec.Machine], rec)
	}
	for _, m := range slices.Sorted(maps.Keys(byMachine)) {
		if _, ok := d.machines[m]; !ok {
			d.add(LayerMachines, Problem, "machine "+m, "%d instance records on a machine that is not a member", len(byMachine[m]))
		}
	}
	ids := slices.Sorted(maps.Keys(d.machines))
	invs := make([]*store.InventoryReply, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, d.o.ProbeTimeout)
			defer cancel()
			var rep store.InventoryReply
			if errs[i] = d.s.Call(pctx, id, store.CmdInventory, struct{}{}, &rep); errs[i] == nil {
				invs[i] = &rep
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		recs := byMachine[id]
		subj := "machine " + id
		if errs[i] != nil {
			d.lastReportedUnrecorded(ctx, id)
			if len(recs) > 0 {
				d.add(LayerMachines, Problem, subj, "does not answer (%v) and %d instances are recorded on it; if it is gone: control machine rm --force %s",
					store.AsError(errs[i]).Message, len(recs), id)
			} else {
				d.add(LayerMachines, Note, subj, "does not answer (%v); nothing is recorded on it", store.AsError(errs[i]).Message)
			}
			continue
		}
		running := map[string]store.InventoryItem{}
		for _, it := range invs[i].Instances {
			running[it.ID] = it
		}
		for _, rec := range recs {
			it, ok := running[rec.ID]
			live := ok && it.Running
			switch rec.State {
			case store.InstanceStarting, store.InstanceReady, store.InstanceDraining:
				if !live {
					d.add(LayerMachines, Problem, subj, "record %s (%s/%s) says %s, but no such process runs there", rec.ID, rec.Namespace, rec.Service, rec.State)
				}
			case store.InstanceStopped, store.InstanceFailed:
				if live {
					d.add(LayerMachines, Problem, subj, "record %s (%s/%s) says %s, but it still runs", rec.ID, rec.Namespace, rec.Service, rec.State)
				}
			}
			delete(running, rec.ID)
		}
		var strays []store.InventoryItem
		for _, it := range running {
			if it.Running {
				strays = append(strays, it)
			}
		}
		sort.Slice(strays, func(i, j int) bool { return strays[i].ID < strays[j].ID })
		for _, it := range strays {
			d.add(LayerMachines, Problem, subj, "%s", strayMessage(id, it))
		}
	}
	d.checked(LayerMachines, len(ids))
	return nil
}

// strayMessage says what an instance machine runs with no record is and
// what to do about it. One its agent runs (not a container the agent does
// not know) was most likely started before the store went back in time.
func strayMessage(machine string, it store.InventoryItem) string {
	msg := fmt.Sprintf("runs instance %s (%s/%s) that has no record: a stray nobody routes or stops", it.ID, it.Namespace, it.Service)
	if it.Unknown {
		return msg
	}
	return msg + fmt.Sprintf("; the store does not know it: the store may have gone back in time (a restored backup, a power cut) "+
		"and forgotten the deploy that started it. If the store is right, stop it: control instance stop %s --machine %s; "+
		"if a newer backup exists, restore that instead", it.ID, machine)
}

// lastReportedUnrecorded names the unrecorded instances machine id's agent
// last reported in its machine state, for a machine that does not answer.
func (d *doctor) lastReportedUnrecorded(ctx context.Context, id string) {
	st, err := d.s.MachineStateOf(ctx, id)
	if err != nil || len(st.Unrecorded) == 0 {
		return
	}
	d.add(LayerMachines, Problem, "machine "+id, "its agent last reported (%s) running instances the store does not know: %s; "+
		"the store may have gone back in time (a restored backup, a power cut)",
		st.UpdatedAt.UTC().Format(time.RFC3339), strings.Join(st.Unrecorded, ", "))
}

// checkMesh compares the mesh peer records with the machines.
func (d *doctor) checkMesh(ctx context.Context) error {
	peers, refused, err := d.s.MeshPeerState(ctx)
	if err != nil {
		return err
	}
	for _, key := range slices.Sorted(maps.Keys(refused)) {
		d.add(LayerMesh, Problem, key, "peer record does not verify (%v): nodes ignore it", refused[key])
	}
	for _, id := range slices.Sorted(maps.Keys(peers)) {
		p := peers[id]
		if _, ok := d.machines[p.Machine]; !ok && !p.Static {
			d.add(LayerMesh, Problem, "machine "+p.Machine, "a mesh peer (%s) with no machine record: a removed machine still in the mesh", p.MeshIP)
		}
	}
	d.checked(LayerMesh, len(peers))
	return nil
}

// checkCerts compares the routed hosts with the certificates the store
// holds.
func (d *doctor) checkCerts(ctx context.Context) error {
	list, err := certs.ListStatus(ctx, d.s)
	if err != nil {
		return err
	}
	d.checked(LayerCerts, len(list))
	byHost := map[string]certs.Status{}
	for _, st := range list {
		byHost[st.Host] = st
		switch {
		case !st.Expiry.IsZero() && st.Expiry.Before(d.now):
			d.add(LayerCerts, Problem, st.Host, "certificate expired at %s", st.Expiry.UTC().Format("2006-01-02 15:04"))
		case st.Failures > 0:
			d.add(LayerCerts, Problem, st.Host, "%d failed renewals in a row, last: %s", st.Failures, st.LastError)
		}
	}
	hosts := d.view.Hosts()
	if len(list) == 0 {
		// No certificate at all: this installation serves plain HTTP
		// (or has not issued yet); a missing one is not news.
		return nil
	}
	var missing []string
	for _, h := range hosts {
		if _, ok := byHost[h]; !ok {
			missing = append(missing, h)
		}
	}
	for _, h := range missing {
		d.add(LayerCerts, Problem, h, "routed without a certificate in the store")
	}
	var unrouted []string
	for h := range byHost {
		// A wildcard certificate is used if any name under it is routed;
		// asking for one label below it answers that for a wildcard route.
		probe := h
		if strings.HasPrefix(h, "*.") {
			probe = "doctor-probe" + h[1:]
		}
		if !d.view.Routes(probe) {
			unrouted = append(unrouted, h)
		}
	}
	sort.Strings(unrouted)
	for _, h := range unrouted {
		d.add(LayerCerts, Note, h, "certificate for a host nothing routes (renewed all the same)")
	}
	return nil
}
