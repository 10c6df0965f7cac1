package deploy

import (
	"context"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// Images become digests once per apply, before the plan compares specs:
// the commit records what every machine resolved.

// pinImages resolves every image of m to its ID on the active
// machines that have a container engine (as their heartbeats and states
// say), which must all agree; an image
// the manifest already pins (a rollback to a commit) must be present on
// each. Nothing is written: a failure here changes nothing.
func (d *Deployer) pinImages(ctx context.Context, m *store.Manifest, st *state) error {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		if m.Services[name].Image != "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	// The machines with an engine, as their agents last said (fresh
	// heartbeat); one that never sent a heartbeat is asked.
	states, beats, err := st.observations(ctx, d.s)
	if err != nil {
		return err
	}
	now := time.Now()
	var engines, ask []string
	for _, id := range slices.Sorted(maps.Keys(st.machines)) {
		if st.machines[id].State != store.MachineActive {
			continue
		}
		b, seen := beats[id]
		switch {
		case !seen:
			ask = append(ask, id)
		case b.Liveness(now) == store.MachineFresh && slices.Contains(states[id].Drivers, "container"):
			engines = append(engines, id)
		}
	}
	for i, p := range machines.Probe(ctx, d.s, ask, d.opts.ProbeTimeout) {
		if p.Err == nil && slices.Contains(p.Reply.Drivers, "container") {
			engines = append(engines, ask[i])
		}
	}
	sort.Strings(engines)
	for _, name := range names {
		spec := m.Services[name]
		if len(engines) == 0 {
			return store.Errorf(store.CodeUnavailable, "no reachable active machine has a container engine for %s.%s (image %s)", m.Namespace, name, spec.Image).
				With("service", name).With("image", spec.Image)
		}
		ref := spec.Image
		if spec.ImageID != "" {
			ref = spec.ImageID
		}
		// Every engine at once: each is an image store lookup, or a pull.
		reps := make([]store.ResolveImageReply, len(engines))
		errs := make([]error, len(engines))
		var wg sync.WaitGroup
		for i, m := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, d.opts.RPCTimeout+time.Minute) // a pull may take a while
				defer cancel()
				errs[i] = d.s.Call(cctx, m, store.CmdResolveImage, store.ResolveImageRequest{Image: ref}, &reps[i])
			}()
		}
		wg.Wait()
		var got, first string
		var silent []string
		for i, m := range engines {
			rep, err := reps[i], errs[i]
			switch {
			case store.HasCode(err, store.CodeRPCFailure):
				// Not answering: placement will not use it either.
				silent = append(silent, m)
			case err != nil && spec.ImageID != "" && store.HasCode(err, store.CodeNotFound):
				return store.Errorf(store.CodeNotFound, "image %s as this deploy pins it (%s) is no longer on machine %s; nothing was started",
					spec.Image, spec.ImageID, m).With("service", name).With("image", spec.Image).With("image_id", spec.ImageID).With("machine", m)
			case err != nil:
				return err
			case got == "":
				got, first = rep.ID, m
			case rep.ID != got:
				return store.Errorf(store.CodeConflict, "image %s is %s on machine %s but %s on %s: give every machine the same image, or name it by digest",
					spec.Image, got, first, rep.ID, m).With("service", name).With("image", spec.Image)
			}
		}
		if got == "" {
			return store.Errorf(store.CodeUnavailable, "no machine with a container engine answered for %s.%s (image %s): %s",
				m.Namespace, name, spec.Image, strings.Join(silent, ", ")).With("service", name).With("image", spec.Image)
		}
		spec.ImageID = got
		m.Services[name] = spec
		d.printf("       %s.%s: image %s is %s (%d machines with an engine answered)", m.Namespace, name, spec.Image, shortID(got), len(engines)-len(silent))
	}
	return nil
}

func shortID(id string) string {
	if len(id) > len("sha256:")+12 {
		return id[:len("sha256:")+12]
	}
	return id
}
