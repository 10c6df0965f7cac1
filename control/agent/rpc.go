package agent

import (
	"context"
	"encoding/json"
	"errors"
	"sort"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
)

// handle answers one RPC on the machine's subject (store.Serve calls it,
// recovering a panic into an internal error).
func (a *Agent) handle(ctx context.Context, command string, data []byte) (any, error) {
	// A test build can make one release stop answering.
	failpoint.Hit("agent_rpc@" + version.Version)
	if store.IsOrder(command) {
		// What changes this box runs only as a signed order, and from
		// here on only the request the signature covers is read.
		req, o, err := a.cfg.Store.VerifyOrder(ctx, a.cfg.Machine.ID, command, store.RequestHeader(ctx), data, a.orders)
		if err != nil {
			se := store.AsError(err)
			a.log.Warn("order refused", zap.String("command", command), zap.String("reason", se.Detail["reason"]),
				zap.String("signer", se.Detail["signer"]), zap.Error(err))
			return nil, err
		}
		if c := a.log.Check(zap.DebugLevel, "order"); c != nil {
			c.Write(zap.String("command", command), zap.String("nonce", o.Nonce), zap.String("signer", signing.SignerOf(store.RequestHeader(ctx).Get(signing.Header))))
		}
		data = req
	}
	switch command {
	case store.CmdCapacity:
		return a.capacity(), nil
	case store.CmdInventory:
		return a.inventory(ctx), nil
	case store.CmdResolveImage:
		var req store.ResolveImageRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.resolveImage(ctx, req)
	case store.CmdLogs:
		var req store.LogsRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.readLogs(ctx, req)
	case store.CmdStartCandidate:
		var req store.StartRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.start(ctx, req)
	case store.CmdReadiness:
		var req store.ReadinessRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.readiness(ctx, req)
	case store.CmdDrainInstance:
		var req store.InstanceRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return nil, a.drain(ctx, req.InstanceID)
	case store.CmdStopInstance:
		var req store.InstanceRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return nil, a.stop(ctx, req)
	case store.CmdRestart, store.CmdStop, store.CmdForceCleanup:
		var req store.LeasedCommand
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.leased(ctx, command, req)
	case store.CmdUpgrade:
		var req store.UpgradeRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.upgradeTo(ctx, req)
	}
	return nil, store.Errorf(store.CodeInvalid, "unknown command %q", command).With("command", command)
}

func decode(command string, data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return store.Errorf(store.CodeInvalid, "decoding %s request: %w", command, err)
	}
	return nil
}

// notHere is the answer about an instance this machine does not run.
func (a *Agent) notHere(id string) error {
	return store.Errorf(store.CodeNotFound, "instance %s does not run on machine %s", id, a.cfg.Machine.ID).With("instance", id)
}

func (a *Agent) capacity() store.CapacityReply {
	n := a.count()
	m := a.cfg.Machine
	return store.CapacityReply{
		Machine: m.ID, Region: m.Region, Labels: m.Labels, Address: m.Address,
		Driver: a.cfg.Driver.Name(), Drivers: a.drivers(), Instances: n, Free: max(0, a.cfg.MaxInstances-n),
	}
}

// inventory lists what the agent runs, and containers with edgeplane's
// labels that it does not know (strays).
func (a *Agent) inventory(ctx context.Context) store.InventoryReply {
	out := store.InventoryReply{Machine: a.cfg.Machine.ID}
	known := map[string]bool{}
	a.locked(func() {
		out.Instances = make([]store.InventoryItem, 0, len(a.instances))
		for _, inst := range a.instances {
			r := inst.Record
			known[r.ID] = true
			out.Instances = append(out.Instances, store.InventoryItem{ID: r.ID, Namespace: r.Namespace, Service: r.Service,
				DeployID: r.DeployID, Running: running(inst.handle)})
		}
	})
	if a.cfg.Containers != nil {
		list, err := a.cfg.Containers.List(ctx)
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
		}
		for _, c := range list {
			if !known[c.Instance] && c.Running {
				out.Instances = append(out.Instances, store.InventoryItem{ID: c.Instance, Namespace: c.Labels[runtime.LabelNamespace],
					Service: c.Labels[runtime.LabelService], Running: true, Container: c.Container, Unknown: true})
			}
		}
	}
	sort.Slice(out.Instances, func(i, j int) bool { return out.Instances[i].ID < out.Instances[j].ID })
	return out
}

// resolveImage answers CmdResolveImage from the engine's image store
// (pulling what it lacks).
func (a *Agent) resolveImage(ctx context.Context, req store.ResolveImageRequest) (*store.ResolveImageReply, error) {
	if a.cfg.Containers == nil {
		return nil, store.Errorf(store.CodeUnavailable, "machine %s has no container engine", a.cfg.Machine.ID).With("machine", a.cfg.Machine.ID)
	}
	img, err := a.cfg.Containers.ResolveImage(ctx, req.Image)
	if errors.Is(err, runtime.ErrNoImage) {
		// The engine's own words (a manifest the registry does not have, a
		// registry that refused or did not answer) say what to fix.
		return nil, store.Errorf(store.CodeNotFound, "image %s is not on machine %s and could not be pulled (%w)", req.Image, a.cfg.Machine.ID, err).
			With("image", req.Image).With("machine", a.cfg.Machine.ID)
	}
	if err != nil {
		return nil, store.Errorf(store.CodeUnavailable, "%w", err).With("machine", a.cfg.Machine.ID)
	}
	return &store.ResolveImageReply{ID: img.ID, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests}, nil
}
