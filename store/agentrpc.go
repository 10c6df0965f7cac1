package store

import (
	"time"

	"github.com/edgeplane/edgeplane/internal/version"
)

// Agent RPC commands, the <command> tail of Names.RPCSubject.
const (
	CmdCapacity       = "capacity"
	CmdStartCandidate = "deploy.start_candidate"
	CmdReadiness      = "deploy.readiness"
	CmdDrainInstance  = "instance.drain"
	CmdStopInstance   = "instance.stop"
	// CmdInventory lists what the agent runs, for control doctor.
	CmdInventory = "inventory"
	// CmdLogs reads a chunk of an instance's output.
	CmdLogs = "logs.read"
	// CmdResolveImage finds an image in the machine's engine.
	CmdResolveImage = "image.resolve"
	// Leased commands: each carries an attempt number that acts as
	// a generation guard.
	CmdRestart      = "command.restart"
	CmdStop         = "command.stop"
	CmdForceCleanup = "command.force_cleanup"
	// CmdUpgrade moves the machine's agent to another release.
	CmdUpgrade = "command.upgrade"
)

// CapacityRequest asks a machine for its live capacity.
type CapacityRequest struct{}

// CapacityReply is a live observation: used for one decision, never stored.
type CapacityReply struct {
	Machine string            `json:"machine"`
	Region  string            `json:"region,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Address string            `json:"address"`
	Driver  string            `json:"driver"`
	// Drivers are every driver the machine has ("process", "container").
	Drivers   []string `json:"drivers,omitempty"`
	Instances int      `json:"instances"`
	// Free is how many more instances the machine accepts now.
	Free int `json:"free"`
}

// InventoryReply is what an agent runs right now, as it sees it: a live
// observation for `control doctor`, never stored.
type InventoryReply struct {
	Machine   string          `json:"machine"`
	Instances []InventoryItem `json:"instances"`
	// Errors say what the agent could not look at (its engine).
	Errors []string `json:"errors,omitempty"`
}

// InventoryItem is one instance an agent runs (or ran: Running false means
// its process exited and the agent has not forgotten it yet).
type InventoryItem struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	DeployID  string `json:"deploy_id,omitempty"`
	Running   bool   `json:"running"`
	// Container is the engine's ID of a container instance.
	Container string `json:"container,omitempty"`
	// Unknown marks a container with edgeplane's labels that the agent
	// does not run: a stray.
	Unknown bool `json:"unknown,omitempty"`
}

// ResolveImageRequest asks a machine's engine for an image.
type ResolveImageRequest struct {
	Image string `json:"image"`
}

// ResolveImageReply is the image as the engine has it: ID is its content
// address, what a deploy pins.
type ResolveImageReply struct {
	ID          string   `json:"id"`
	RepoTags    []string `json:"repo_tags,omitempty"`
	RepoDigests []string `json:"repo_digests,omitempty"`
}

// LogsRequest asks for a chunk of an instance's output (stdout and stderr,
// as one stream, across its restarts).
type LogsRequest struct {
	InstanceID string `json:"instance_id"`
	Namespace  string `json:"namespace"`
	// Offset is where to read from; -1 starts at Since if set, else at the
	// last MaxLogChunk bytes.
	Offset int64     `json:"offset"`
	Since  time.Time `json:"since,omitzero"`
}

// MaxLogChunk bounds the output one LogsReply carries: agent replies must
// fit the agent role's payload limit.
const MaxLogChunk = 32 << 10

// LogsReply is a chunk of output: Data was at Offset; Next is where the
// following request reads from, and Size the output's length now (a Size
// below an earlier Next means it was truncated: start again at 0).
type LogsReply struct {
	Data   []byte `json:"data"`
	Offset int64  `json:"offset"`
	Next   int64  `json:"next"`
	Size   int64  `json:"size"`
}

// StartRequest asks a machine to start a candidate instance.
type StartRequest struct {
	Instance InstanceRecord `json:"instance"`
	Spec     ServiceSpec    `json:"spec"`
}

// StartReply reports the started instance as the agent recorded it.
type StartReply struct {
	Instance InstanceRecord `json:"instance"`
}

// ReadinessRequest waits until an instance is ready or Timeout passes.
type ReadinessRequest struct {
	InstanceID string   `json:"instance_id"`
	Namespace  string   `json:"namespace"`
	Timeout    Duration `json:"timeout"`
}

// ReadinessReply tells whether the instance became ready.
type ReadinessReply struct {
	Ready    bool           `json:"ready"`
	Error    string         `json:"error,omitempty"`
	Instance InstanceRecord `json:"instance"`
}

// InstanceRequest names one instance for drain and stop.
type InstanceRequest struct {
	InstanceID string `json:"instance_id"`
	Namespace  string `json:"namespace"`
	// Grace is how long SIGTERM may take before SIGKILL; 0 means the agent
	// default.
	Grace Duration `json:"grace,omitempty"`
	// Forget removes the instance record after the stop.
	Forget bool `json:"forget,omitempty"`
}

// LeasedCommand is a leased command: the agent refuses an attempt
// older than the newest it has seen for the same instance, so a stale
// completion can never overwrite a newer one.
type LeasedCommand struct {
	InstanceID string   `json:"instance_id"`
	Namespace  string   `json:"namespace"`
	Service    string   `json:"service,omitempty"`
	Attempt    int      `json:"attempt"`
	Grace      Duration `json:"grace,omitempty"`
}

// LeasedReply reports a leased command's outcome with its attempt.
type LeasedReply struct {
	Attempt  int       `json:"attempt"`
	Done     bool      `json:"done"`
	Detail   string    `json:"detail,omitempty"`
	Finished time.Time `json:"finished"`
}

// RepublishRequest asks the control plane to publish one service's routing
// again, derived from stored state. An agent sends it on its own machine's
// RoutingRepublishSubject after one of its instances drains, fails or
// restarts; it may write its own instance records but never routing events,
// so its credentials cannot forge where a service's traffic goes.
type RepublishRequest struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
}

// RepublishReply carries the routing stream sequence of the published
// upsert; 0 when the live commit no longer has the service.
type RepublishReply struct {
	Seq uint64 `json:"seq,omitempty"`
}

// UpgradeRequest tells a machine's agent to move to Release: fetch and
// verify its binary, restart into it, and keep it only if it passes its
// health gate within HealthBound. Attempt guards the generation like a
// leased command's: an older attempt than one seen is refused as stale.
type UpgradeRequest struct {
	Release string `json:"release"`
	Rollout string `json:"rollout,omitempty"`
	Attempt int    `json:"attempt"`
	// AllowDowngrade lets Release be older than what runs.
	AllowDowngrade bool     `json:"allow_downgrade,omitempty"`
	HealthBound    Duration `json:"health_bound"`
}

// Against checks the request on a process (who: "machine m1", "storage
// node s1") that runs release cur: an error for a malformed release or a
// downgrade nobody asked for, else the reply, which says so when cur is
// the release already (done: nothing to do).
func (r *UpgradeRequest) Against(cur, who string) (rep *UpgradeReply, done bool, err error) {
	if _, err := version.Parse(r.Release); err != nil {
		return nil, false, Errorf(CodeInvalid, "%v", err)
	}
	rep = &UpgradeReply{Attempt: r.Attempt, From: cur, To: r.Release}
	if r.Release == cur {
		rep.Detail = "already running " + cur
		return rep, true, nil
	}
	if version.Older(r.Release, cur) && !r.AllowDowngrade {
		return nil, false, Errorf(CodeConflict, "release %s is older than %s, which %s runs; going back needs the operator to say so (--allow-downgrade)",
			r.Release, cur, who).With("reason", "downgrade").With("running", cur).With("release", r.Release)
	}
	return rep, false, nil
}

// UpgradeReply says what the agent did: Restarting when it is about to
// restart into the new release (its outcome comes in its machine state),
// or Detail when there was nothing to do.
type UpgradeReply struct {
	Attempt    int    `json:"attempt"`
	From       string `json:"from"`
	To         string `json:"to"`
	Restarting bool   `json:"restarting,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// UpgradeStatus is a machine's latest upgrade as its agent reports it in
// its MachineState.
type UpgradeStatus struct {
	Rollout string    `json:"rollout,omitempty"`
	Attempt int       `json:"attempt"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	State   string    `json:"state"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at"`
}
