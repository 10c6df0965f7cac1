package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/docker/go-units"
	"gopkg.in/yaml.v3"
)

// RecordVersion is the schema version written into every record. A reader
// refuses records from a newer schema instead of guessing at their meaning.
const RecordVersion = 1

// checkVersion rejects records written by a newer schema.
func checkVersion(kind string, v int) error {
	if v > RecordVersion {
		return fmt.Errorf("%s record version %d is newer than this build understands (%d)", kind, v, RecordVersion)
	}
	return nil
}

// Decode unmarshals a JSON record and checks its schema version. kind names
// the record in errors.
func Decode(kind string, data []byte, v interface{ version() int }) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decoding %s record: %w", kind, err)
	}
	return checkVersion(kind, v.version())
}

// Duration is a time.Duration written as a Go duration string ("5s") in JSON
// and YAML.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration must be a string like \"5s\"")
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("duration %q: %w", n.Value, err)
	}
	*d = Duration(v)
	return nil
}

// Manifest is what an operator asks to run in a namespace. It is parsed and
// validated by control/manifest and stored inside deploy commits.
type Manifest struct {
	Namespace string                 `json:"namespace" yaml:"namespace"`
	Services  map[string]ServiceSpec `json:"services" yaml:"services"`
	// Rollout, when set, takes every changed service through canary
	// steps before the final commit.
	Rollout *CanarySpec `json:"rollout,omitempty" yaml:"rollout,omitempty"`
}

// ServiceSpec describes one service of a manifest.
type ServiceSpec struct {
	// Command is the program and its arguments. The instance gets HOST and
	// PORT in its environment and must listen there. With Image it
	// replaces the image's entrypoint.
	Command []string `json:"command,omitempty" yaml:"command,omitempty"`
	// Image makes the service a container ("registry/name:tag" or
	// "name@sha256:..."), run by agents with a container engine.
	Image string `json:"image,omitempty" yaml:"image,omitempty"`
	// ImageID is the image's content address ("sha256:...") that the
	// apply resolved Image to and the commit records: every start of the
	// commit, every restart and every rollback to it runs that, whatever
	// the tag names later. YAML manifests do not carry it.
	ImageID string `json:"image_id,omitempty" yaml:"-"`
	// ReadOnly mounts a container's root filesystem read-only.
	ReadOnly bool `json:"read_only,omitempty" yaml:"read_only,omitempty"`
	// Resources limit a container.
	Resources Resources         `json:"resources,omitzero" yaml:"resources,omitempty"`
	Env       map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Replicas is the number of slots; nil means 1.
	Replicas *int `json:"replicas,omitempty" yaml:"replicas,omitempty"`
	// Port is a fixed port for every instance; 0 lets the agent pick a free one.
	Port      int       `json:"port,omitempty" yaml:"port,omitempty"`
	Readiness Readiness `json:"readiness,omitempty" yaml:"readiness,omitempty"`
	Routes    []Route   `json:"routes,omitempty" yaml:"routes,omitempty"`
	Placement Placement `json:"placement,omitempty" yaml:"placement,omitempty"`
	// Restart is what the agent does when an instance ends on its own:
	// RestartAlways (the default, ""), RestartOnFailure or RestartNever.
	Restart string `json:"restart,omitempty" yaml:"restart,omitempty"`
	// Locality is which region's instances a gateway serves from
	// (regions.go); nil is LocalityPrefer.
	Locality *Locality `json:"locality,omitempty" yaml:"locality,omitempty"`
	// SlowStart is the window over which a newly routable instance's
	// share of the traffic ramps up to a full one; zero is none.
	SlowStart Duration `json:"slow_start,omitempty" yaml:"slow_start,omitempty"`
	// Layer4 is what the service exposes through gateways below HTTP
	// (layer4.go): tcp and udp ports, tls_passthrough hosts and the
	// drain_timeout of their connections, inline in the manifest.
	Layer4 `yaml:",inline"`
}

// Resources limit a container: CPUs (0.5 is half a core) and Memory
// ("64Mi", "1G", or bytes). Zero is no limit.
type Resources struct {
	CPUs   float64 `json:"cpus,omitempty" yaml:"cpus,omitempty"`
	Memory string  `json:"memory,omitempty" yaml:"memory,omitempty"`
}

// Restart policies of a service.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure"
	RestartNever     = "never"
)

// RestartPolicy is Restart with its default applied.
func (s ServiceSpec) RestartPolicy() string {
	if s.Restart == "" {
		return RestartAlways
	}
	return s.Restart
}

// ReplicaCount is Replicas with its default applied.
func (s ServiceSpec) ReplicaCount() int {
	if s.Replicas == nil {
		return 1
	}
	return *s.Replicas
}

// Readiness is how an agent decides that an instance is ready.
type Readiness struct {
	// Path is an HTTP path that must answer 2xx; empty means a TCP connect.
	Path string `json:"path,omitempty" yaml:"path,omitempty"`
	// Timeout bounds the whole wait; default 30s.
	Timeout Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// ReadyStatus says whether a status answered on a readiness path means
// the instance is ready: any 2xx (after redirects). The agent's readiness
// and the gateway's probe of the same path judge by this one rule, so an
// instance the agent calls ready is not set aside by a gateway, nor one
// the gateway calls healthy left out by its agent.
func ReadyStatus(code int) bool { return code >= 200 && code <= 299 }

// Route sends requests for Hosts (exact or "*.suffix") whose path starts with
// one of PathPrefixes (default "/") to the service. The other fields are
// the route's policy: what the gateway does with its requests on the way,
// through Caddy's own handlers where Caddy has one.
type Route struct {
	Hosts        []string `json:"hosts" yaml:"hosts"`
	PathPrefixes []string `json:"path_prefixes,omitempty" yaml:"path_prefixes,omitempty"`
	// RedirectHTTPS answers a plain-HTTP request with a permanent
	// redirect (308) to the same URL over HTTPS.
	RedirectHTTPS bool `json:"redirect_https,omitempty" yaml:"redirect_https,omitempty"`
	// StripPrefix removes the path prefix that matched before the request
	// goes to the service ("/api/users" under "/api" is "/users").
	StripPrefix bool `json:"strip_prefix,omitempty" yaml:"strip_prefix,omitempty"`
	// RequestHeaders and ResponseHeaders change headers on the way to the
	// service and back.
	RequestHeaders  *HeaderOps `json:"request_headers,omitempty" yaml:"request_headers,omitempty"`
	ResponseHeaders *HeaderOps `json:"response_headers,omitempty" yaml:"response_headers,omitempty"`
	// MaxRequestBody refuses larger request bodies with 413 ("10MB",
	// "512KiB", or bytes).
	MaxRequestBody string `json:"max_request_body,omitempty" yaml:"max_request_body,omitempty"`
	// Timeouts bound the gateway's wait on the service.
	Timeouts *RouteTimeouts `json:"timeouts,omitempty" yaml:"timeouts,omitempty"`
	// Retries sends an idempotent request again, to an instance the load
	// balancer picks anew, when the service answers one of OnStatus.
	Retries *RouteRetries `json:"retries,omitempty" yaml:"retries,omitempty"`
	// Edge protection (edge.go): who may reach the route, how fast, what
	// its errors look like and what its access lines carry.
	BasicAuth   *BasicAuth        `json:"basic_auth,omitempty" yaml:"basic_auth,omitempty"`
	ForwardAuth *ForwardAuth      `json:"forward_auth,omitempty" yaml:"forward_auth,omitempty"`
	Allow       []string          `json:"allow,omitempty" yaml:"allow,omitempty"`
	Deny        []string          `json:"deny,omitempty" yaml:"deny,omitempty"`
	RateLimit   *RateLimit        `json:"rate_limit,omitempty" yaml:"rate_limit,omitempty"`
	ErrorPages  map[int]ErrorPage `json:"error_pages,omitempty" yaml:"error_pages,omitempty"`
	AccessLog   *AccessLogPolicy  `json:"access_log,omitempty" yaml:"access_log,omitempty"`
}

// HasPolicy reports whether r asks the gateway for more than routing.
func (r *Route) HasPolicy() bool {
	return r.RedirectHTTPS || r.StripPrefix || r.RequestHeaders != nil || r.ResponseHeaders != nil ||
		r.MaxRequestBody != "" || r.Timeouts != nil || r.Retries != nil || r.HasProtection() ||
		len(r.ErrorPages) > 0
}

// HasProtection reports whether r restricts who reaches it or how fast: a
// gateway that cannot read these fields would serve the route open, so a
// manifest using them is not applied while one is live.
func (r *Route) HasProtection() bool {
	return r.BasicAuth != nil || r.ForwardAuth != nil || len(r.Allow) > 0 || len(r.Deny) > 0 || r.RateLimit != nil
}

// HeaderOps sets (replacing), adds and deletes header fields.
type HeaderOps struct {
	Set    map[string]string `json:"set,omitempty" yaml:"set,omitempty"`
	Add    map[string]string `json:"add,omitempty" yaml:"add,omitempty"`
	Delete []string          `json:"delete,omitempty" yaml:"delete,omitempty"`
}

// RouteTimeouts bound the gateway's wait on an instance: Connect for a
// connection (a timeout is a dial error: the request goes to another
// instance), ResponseHeader from the request sent to the response
// headers (504). Zero is the gateway's own setting.
type RouteTimeouts struct {
	Connect        Duration `json:"connect,omitempty" yaml:"connect,omitempty"`
	ResponseHeader Duration `json:"response_header,omitempty" yaml:"response_header,omitempty"`
}

// RouteRetries retries idempotent requests (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE; a body only up to MaxRetryBody) answered with one of OnStatus,
// at most Max times (default 1).
type RouteRetries struct {
	OnStatus []int `json:"on_status" yaml:"on_status"`
	Max      int   `json:"max,omitempty" yaml:"max,omitempty"`
}

// MaxRetryBody is the largest request body a retry keeps to send again;
// a request with a larger one is not retried.
const MaxRetryBody = 64 << 10

// ParseByteSize parses a size: bytes, or a number with a K, M, G or T
// suffix (powers of 1024; "KB", "KiB" spellings too).
func ParseByteSize(s string) (int64, error) {
	n, err := units.RAMInBytes(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "B"), "i"))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want bytes or a number with K, M, G or T", s)
	}
	return n, nil
}

// Placement restricts which machines may run a service.
type Placement struct {
	Regions []string          `json:"regions,omitempty" yaml:"regions,omitempty"`
	Labels  map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

// CommitKind tells a checkpoint commit from the final one.
type CommitKind string

const (
	CommitCheckpoint CommitKind = "checkpoint"
	CommitFinal      CommitKind = "final"
)

// SlotAssignment binds one slot of a service to the instance that serves it.
type SlotAssignment struct {
	Service    string `json:"service"`
	Slot       int    `json:"slot"`
	InstanceID string `json:"instance_id"`
	Machine    string `json:"machine"`
	// Revision is the namespace revision that started the instance; an
	// unchanged service keeps instances from older revisions.
	Revision int64  `json:"revision"`
	SpecHash string `json:"spec_hash"`
}

// DeployCommit is durable intent: an immutable fact appended to the commits
// stream. The latest final commit of a namespace is what it serves.
type DeployCommit struct {
	Version      int              `json:"version"`
	ID           string           `json:"id"`
	Namespace    string           `json:"namespace"`
	Kind         CommitKind       `json:"kind"`
	Revision     int64            `json:"revision"`
	Phase        string           `json:"phase,omitempty"`
	Manifest     Manifest         `json:"manifest"`
	ManifestHash string           `json:"manifest_hash"`
	Slots        []SlotAssignment `json:"slots"`
	// RollbackOf names the commit whose spec this deploy re-applied.
	RollbackOf string `json:"rollback_of,omitempty"`
	// Canary marks a checkpoint commit as a canary step, or its abort.
	Canary *Canary `json:"canary,omitempty"`
	// Destroy marks the final commit of `control deploy destroy`: no
	// services, every instance stopped, every host released.
	Destroy bool `json:"destroy,omitempty"`
	// Replaces is the final commit this one superseded (empty for the first
	// deploy of a namespace): removals of services derive from it.
	Replaces    string    `json:"replaces,omitempty"`
	ReplacesSeq uint64    `json:"replaces_seq,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// Seq is the stream sequence, filled in when read; not stored.
	Seq uint64 `json:"-"`
}

func (r *DeployCommit) version() int { return r.Version }

// SlotsOf returns the commit's slots for service.
func (r *DeployCommit) SlotsOf(service string) []SlotAssignment {
	var out []SlotAssignment
	for _, s := range r.Slots {
		if s.Service == service {
			out = append(out, s)
		}
	}
	return out
}

// DeployState is where one deploy attempt stands.
type DeployState string

// Deploy states.
const (
	DeployApplying              DeployState = "applying"
	DeployCommitted             DeployState = "committed"
	DeployFailed                DeployState = "failed"
	DeployFailedAfterCheckpoint DeployState = "FailedAfterCheckpoint"
)

// DeployStatus is durable status of one deploy attempt, changed only by the
// operation that owns it (or the explicit completion of a committed deploy).
type DeployStatus struct {
	Version   int         `json:"version"`
	Namespace string      `json:"namespace"`
	DeployID  string      `json:"deploy_id"`
	Revision  int64       `json:"revision"`
	State     DeployState `json:"state"`
	// Phase is the last step the apply reached.
	Phase      string `json:"phase"`
	Error      *Error `json:"error,omitempty"`
	RollbackOf string `json:"rollback_of,omitempty"`
	// Destroy marks a `control deploy destroy`.
	Destroy bool `json:"destroy,omitempty"`
	// CommitSeq is the final commit's stream sequence once committed.
	CommitSeq uint64 `json:"commit_seq,omitempty"`
	// RoutingPublished is set once every routing event derived from the
	// final commit is in the routing stream.
	RoutingPublished bool `json:"routing_published"`
	// RoutingSeq is the last routing event sequence of this deploy.
	RoutingSeq uint64 `json:"routing_seq,omitempty"`
	// Gateways summarises the bounded wait for gateways, e.g. "2/2".
	Gateways string `json:"gateways,omitempty"`
	// Cleanup lists recoverable failures while stopping old instances.
	Cleanup []CleanupFailure `json:"cleanup,omitempty"`
	// Settled is set once nothing of the deploy is left to do: committed,
	// published, drained and every instance it replaced stopped; or failed
	// with every candidate stopped. Until then `control server` finishes
	// it when its orchestrator is gone.
	Settled  bool     `json:"settled,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Canary are the canary steps the deploy went through, as judged.
	Canary    []CanaryStepStatus `json:"canary,omitempty"`
	StartedAt time.Time          `json:"started_at"`
	UpdatedAt time.Time          `json:"updated_at"`
	// Rev is the KV revision, filled in when read.
	Rev uint64 `json:"-"`
}

func (r *DeployStatus) version() int { return r.Version }

// CleanupFailure is an old instance the apply could not stop; recoverable.
type CleanupFailure struct {
	InstanceID string `json:"instance_id"`
	Machine    string `json:"machine"`
	Error      string `json:"error"`
}

// PhaseState is where one apply step of one deploy stands.
type PhaseState string

// Phase states.
const (
	PhasePending PhaseState = "pending"
	PhaseRunning PhaseState = "running"
	PhaseDone    PhaseState = "done"
	PhaseFailed  PhaseState = "failed"
	PhaseSkipped PhaseState = "skipped"
)

// PhaseRecord is the durable status of one apply step of one deploy.
type PhaseRecord struct {
	Version   int        `json:"version"`
	Namespace string     `json:"namespace"`
	DeployID  string     `json:"deploy_id"`
	Index     int        `json:"index"`
	Name      string     `json:"name"`
	State     PhaseState `json:"state"`
	CommitSeq uint64     `json:"commit_seq,omitempty"`
	Detail    string     `json:"detail,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
}

func (r *PhaseRecord) version() int { return r.Version }

// InstanceState is where an instance is in its life, as its agent
// records and observes it.
type InstanceState string

// Instance states.
const (
	InstanceStarting InstanceState = "starting"
	InstanceReady    InstanceState = "ready"
	InstanceDraining InstanceState = "draining"
	InstanceStopped  InstanceState = "stopped"
	InstanceFailed   InstanceState = "failed"
	// InstanceBackoff: it ended on its own and its agent restarts it at
	// NextRestart; out of the routing until ready again.
	InstanceBackoff InstanceState = "backoff"
)

// InstanceRecord is durable status of one running (or once running) instance.
type InstanceRecord struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	Slot      int    `json:"slot"`
	Revision  int64  `json:"revision"`
	DeployID  string `json:"deploy_id"`
	SpecHash  string `json:"spec_hash"`
	Machine   string `json:"machine"`
	// Address is the instance's overlay IP; Port its listening port.
	Address string        `json:"address"`
	Port    int           `json:"port"`
	State   InstanceState `json:"state"`
	// Error is an unrecovered error; a non-empty value makes it unroutable.
	Error  string `json:"error,omitempty"`
	Driver string `json:"driver"`
	PID    int    `json:"pid,omitempty"`
	// Container is the engine's ID of a container instance's current run.
	Container string    `json:"container,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Restarts counts the agent's restarts of this instance; LastExit is
	// how it last ended on its own, and when.
	Restarts   int       `json:"restarts,omitempty"`
	LastExit   string    `json:"last_exit,omitempty"`
	LastExitAt time.Time `json:"last_exit_at,omitzero"`
	// NextRestart is when a backoff ends.
	NextRestart time.Time `json:"next_restart,omitzero"`
}

func (r *InstanceRecord) version() int { return r.Version }

// Key is the instance's key in the instances bucket.
func (r *InstanceRecord) Key() string { return InstanceKey(r.Namespace, r.Machine, r.ID) }

// InstanceKey is "<namespace>.<machine>.<instance id>". The key names the
// machine so that an agent's credentials can be limited to its own
// machine's instance records ("*.<machine>.*", see RolePermissions); a
// namespace's records are still one filter away ("<namespace>.>").
func InstanceKey(namespace, machine, id string) string {
	return namespace + "." + machine + "." + id
}

// InstanceFilter is the key filter of one instance of namespace, whatever
// machine it runs on.
func InstanceFilter(namespace, id string) string { return namespace + ".*." + id }

// NamespaceInstancesFilter is the key filter of every instance record of
// namespace ("*" for all namespaces).
func NamespaceInstancesFilter(namespace string) string { return namespace + ".*.*" }

// Machine states.
const (
	MachineActive   = "active"
	MachineDraining = "draining"
	MachineDisabled = "disabled"
)

// MachineRecord is durable intent: a machine an operator admitted.
type MachineRecord struct {
	Version int               `json:"version"`
	ID      string            `json:"id"`
	Region  string            `json:"region,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	State   string            `json:"state"`
	// Address is the machine's overlay (mesh) IP that instances are reached on.
	Address   string    `json:"address"`
	JoinedAt  time.Time `json:"joined_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (r *MachineRecord) version() int { return r.Version }

// Invite is a single-use, expiring admission ticket, stored under the hash of
// its token so reading the bucket does not reveal usable tokens.
type Invite struct {
	Version int               `json:"version"`
	Region  string            `json:"region,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Address, if set, is the only address the machine may be admitted
	// at: the operator's say, where the agent's would not do (a loopback
	// address on a store other boxes reach).
	Address   string    `json:"address,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// UsedBy is the machine that redeemed the invite first; only that
	// machine's other roles may redeem it after.
	UsedBy string    `json:"used_by,omitempty"`
	UsedAt time.Time `json:"used_at,omitempty"`
	// Uses are what it was redeemed for (InviteUseEnroll, InviteUseAdmit,
	// InviteUseMesh), each at most once.
	Uses []string `json:"uses,omitempty"`
}

func (r *Invite) version() int { return r.Version }

// Routing event kinds.
const (
	EventServiceUpsert = "service.upsert"
	EventServiceRemove = "service.remove"
	EventMachineUpsert = "machine.upsert"
	EventMachineRemove = "machine.remove"
	// EventRegionUpsert sets a region's state (RegionRecord).
	EventRegionUpsert = "region.upsert"
)

// Endpoint is one routable instance of a service.
type Endpoint struct {
	InstanceID string `json:"instance_id"`
	Machine    string `json:"machine"`
	Slot       int    `json:"slot"`
	Revision   int64  `json:"revision"`
	Address    string `json:"address"`
	Port       int    `json:"port"`
}

// RoutingEvent is one ordered fact of the routing stream. A service upsert
// carries the complete routable state of (Namespace, Service), its contract
// identity, and replaces whatever a projection held for it; a removal drops
// it. Machine events do the same for machines.
type RoutingEvent struct {
	Version   int        `json:"version"`
	Kind      string     `json:"kind"`
	Namespace string     `json:"namespace,omitempty"`
	Service   string     `json:"service,omitempty"`
	DeployID  string     `json:"deploy_id,omitempty"`
	Revision  int64      `json:"revision,omitempty"`
	Routes    []Route    `json:"routes,omitempty"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// HealthPath is the service's readiness path (Readiness.Path), which
	// gateways probe each endpoint at; empty when readiness is a TCP
	// connect.
	HealthPath string `json:"health_path,omitempty"`
	// Split divides the service's traffic during a canary.
	Split *Split `json:"split,omitempty"`
	// Locality and SlowStart are the service's (ServiceSpec).
	Locality  *Locality `json:"locality,omitempty"`
	SlowStart Duration  `json:"slow_start,omitempty"`
	// Layer4 is the service's (ServiceSpec), inline.
	Layer4
	Machine *MachineRecord `json:"machine,omitempty"`
	Region  *RegionRecord  `json:"region,omitempty"`
	// Maintenance is a maintenance.upsert's record (edge.go).
	Maintenance *MaintenanceRecord `json:"maintenance,omitempty"`
	At          time.Time          `json:"at"`
	// Seq is the stream sequence, filled in when read; not stored.
	Seq uint64 `json:"-"`
}

func (r *RoutingEvent) version() int { return r.Version }

// Identity is the contract identity an upsert replaces and a removal drops.
func (r *RoutingEvent) Identity() string {
	switch r.Kind {
	case EventMachineUpsert, EventMachineRemove:
		if r.Machine != nil {
			return "machine/" + r.Machine.ID
		}
		return "machine/"
	case EventRegionUpsert:
		if r.Region != nil {
			return "region/" + r.Region.Name
		}
		return "region/"
	case EventMaintenanceUpsert:
		if r.Maintenance != nil {
			return "maintenance/" + r.Maintenance.Namespace + "/" + r.Maintenance.Service
		}
		return "maintenance/"
	default:
		return "service/" + r.Namespace + "/" + r.Service
	}
}

// GatewayObservation is what one gateway reports of itself: the last routing
// sequence it applied. An observation, never truth; it ages out of its bucket.
type GatewayObservation struct {
	Version int    `json:"version"`
	Gateway string `json:"gateway"`
	// Region is the gateway's own region ("" for none).
	Region     string    `json:"region,omitempty"`
	AppliedSeq uint64    `json:"applied_seq"`
	Stale      bool      `json:"stale"`
	At         time.Time `json:"at"`
	// Digest hashes what the gateway serves at AppliedSeq (see
	// projection.View.Digest); Hosts counts the hosts it routes.
	Digest string `json:"digest,omitempty"`
	Hosts  int    `json:"hosts,omitempty"`
	// Conflicts are hosts routed by more than one namespace in the
	// gateway's view ("host: owner over others"), at most a few.
	Conflicts []string `json:"conflicts,omitempty"`
	// L4Draining are the instances that left routing to which the gateway
	// still has layer-4 connections; L4Errors the ports it could not open.
	// Each at most MaxL4Reported.
	L4Draining []L4Drain     `json:"l4_draining,omitempty"`
	L4Errors   []L4PortError `json:"l4_errors,omitempty"`
	// Release and Generation are what the gateway runs (stamped by
	// PutGatewayObservation; empty from a gateway before announcements).
	Release    string `json:"release,omitempty"`
	Generation int    `json:"generation,omitempty"`
}

func (r *GatewayObservation) version() int { return r.Version }
