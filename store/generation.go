package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/internal/version"
)

// Schema generations. A generation is what a process reads and writes of
// the store's layout: a writer that needs its readers to read something new
// checks that every reader announces that generation (or that the floor
// requires it of them) before relying on it. Each process announces its
// release and generation where it already writes (agent heartbeats,
// gateway reports, mesh heartbeats, a control server's ServerRecord), and
// refuses to start on a store whose floor is above its generation.
//
//   - 1: instance records only: an instance's ready, backoff and draining
//     are in its InstanceRecord (releases before 7fdb3aa, 2026-11-26).
//   - 2: per-machine observation records (cp_observed_*, MachineObserved):
//     an agent records ready, backoff and draining there only, and readers
//     take the newer of record and observation (releases up to v0.38.0).
//   - 3: announcements: processes say their release and generation, and
//     the store's floor (StoreFloor) refuses processes below it (v0.39.0).
//   - 4: regions: region states are routing events (region.upsert) and
//     service upserts carry a locality policy (v0.40.0). A reader before it
//     refuses a region event as one it cannot read and serves every region
//     alike, so a region state is not set while one is live.
//   - 5: layer 4: service upserts carry tcp/udp ports and passthrough
//     hosts (Layer4) and gateways serve them (v0.41.0). A gateway before
//     it ignores them and serves the service's HTTP routes only, so a
//     manifest exposing a layer-4 entry point is not applied while one is
//     live.
//   - 6: edge protection: routes carry basic_auth, forward_auth,
//     allow/deny, rate_limit, error_pages and access_log, and maintenance
//     is a routing event (maintenance.upsert) (v0.42.0). A gateway before
//     it would serve a protected route open and refuse a maintenance
//     event, so neither is applied while one is live.
//   - 7: routing batches: a commit's or canary step's routing of a
//     namespace is a few batch parts under one seal (routing.ns.<ns>.<i>,
//     routingbatch.go) instead of a message per service (v0.43.0). A
//     reader before it would skip the parts as events it cannot read, so
//     the control plane publishes one message per service while one is
//     live (a fallback, not a refusal).
const SchemaGeneration = 7

// GenerationBatches is the first generation whose gateways read routing
// batches.
const GenerationBatches = 7

// GenerationEdge is the first generation whose gateways enforce a route's
// protection and serve maintenance.
const GenerationEdge = 6

// GenerationLayer4 is the first generation whose gateways serve layer-4
// entry points.
const GenerationLayer4 = 5

// GenerationRegions is the first generation whose gateways read region
// states.
const GenerationRegions = 4

// GenerationObserved is the first generation that reads an instance's
// state from its machine's observation record: an agent writes ready,
// backoff and draining there only once every reader is at it.
const GenerationObserved = 2

// firstRelease is the first release of each generation, which a refusal
// names. Generation 1 has none: it is every release before observations.
var firstRelease = map[int]string{2: "0.38.0", 3: "0.39.0", 4: "0.40.0", 5: "0.41.0", 6: "0.42.0", 7: "0.43.0"}

// FirstReleaseOf is the first release of generation gen, "" when unknown.
func FirstReleaseOf(gen int) string { return firstRelease[gen] }

// GenerationOf is the generation a process announced, or, for one that
// announced none, the oldest it may be: one that names a release of
// generation 2 or later (v0.38.0 named its release in heartbeats, not its
// generation) is at that release's; any other is taken as generation 1,
// since a process of generation 1 and one of 2 that announce nothing look
// alike, and taking the older is the safe side.
func GenerationOf(announced int, release string) int {
	if announced > 0 {
		return announced
	}
	gen := 1
	for g, first := range firstRelease {
		if g > gen && g < SchemaGeneration && !version.Older(release, first) && release != "" && release != "dev" {
			gen = g
		}
	}
	return gen
}

// Announcement is what this process says it is: its release and the
// generation it reads and writes. Every writer of an announcing record
// stamps it from here.
func Announcement() (release string, generation int) { return version.Version, SchemaGeneration }

// floorKey is the floor's key in the meta bucket.
const floorKey = "floor"

// StoreFloor is the lowest generation (and so release) a process must be
// at to use the store. The control plane raises it, never lowers it, once
// what its writers need of every reader is announced by every process it
// can see (control/controlplane). Key: "floor" in the meta bucket.
type StoreFloor struct {
	Version       int       `json:"version"`
	MinGeneration int       `json:"min_generation"`
	MinRelease    string    `json:"min_release,omitempty"`
	SetBy         string    `json:"set_by"`
	At            time.Time `json:"at"`
}

func (r *StoreFloor) version() int { return r.Version }

// Floor reads the store's floor: a store without one (or provisioned
// before floors) has the zero floor, which refuses nobody.
func (s *Store) Floor(ctx context.Context) (*StoreFloor, uint64, error) {
	var f StoreFloor
	rev, err := GetJSON(ctx, s.meta, floorKey, &f)
	switch {
	case err == nil:
		return &f, rev, nil
	case HasCode(err, CodeNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return &StoreFloor{}, 0, nil
	}
	return nil, 0, fmt.Errorf("reading the store's floor: %w", err)
}

// RaiseFloor raises the floor to generation gen (naming its first release),
// set by setBy. A floor already at gen or above is left as it is: a floor
// never goes down, since the processes it refused may be gone for good
// and their readers' records with them. It returns the floor now stored.
func (s *Store) RaiseFloor(ctx context.Context, gen int, setBy string) (*StoreFloor, error) {
	for {
		cur, rev, err := s.Floor(ctx)
		if err != nil {
			return nil, err
		}
		if cur.MinGeneration >= gen {
			return cur, nil
		}
		f := &StoreFloor{Version: RecordVersion, MinGeneration: gen, MinRelease: FirstReleaseOf(gen), SetBy: setBy, At: time.Now().UTC()}
		data, err := json.Marshal(f)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = s.meta.Create(ctx, floorKey, data)
		} else {
			_, err = s.meta.Update(ctx, floorKey, data, rev)
		}
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !IsWrongLastSequence(err) {
			return nil, classify(fmt.Errorf("raising the store's floor to generation %d: %w", gen, err))
		}
		// Another server raised it meanwhile: read it again.
	}
}

// TooOld is the refusal of a process of generation gen and release release
// (what: "control server", "agent", ...) on a store whose floor is f, or
// nil when f lets it in.
func TooOld(f *StoreFloor, what string, gen int, release string) error {
	if f == nil || gen >= f.MinGeneration {
		return nil
	}
	need := "edgeplane"
	if f.MinRelease != "" {
		need += " >= " + f.MinRelease
	}
	return Errorf(CodeTooOld, "this store needs %s (schema generation %d); this is %s %s (schema generation %d): upgrade it",
		need, f.MinGeneration, what, release, gen).
		With("min_release", f.MinRelease).With("min_generation", fmt.Sprint(f.MinGeneration)).
		With("release", release).With("set_by", f.SetBy)
}

// floorReadTimeout bounds the floor's read at start. Credentials issued
// before the meta bucket existed may not read it: the read is then never
// answered, and the process must not wait long for an answer that does not
// come (CheckFloor says it could not read).
const floorReadTimeout = 3 * time.Second

// CheckFloor refuses this process (what it is, e.g. "agent") with a
// too_old error when the store's floor is above its generation. A floor
// that cannot be read is another error, for the caller to log and go on
// with: refusing to start on an unreadable floor would stop every box
// whose credentials predate it.
func (s *Store) CheckFloor(ctx context.Context, what string) error {
	ctx, cancel := context.WithTimeout(ctx, floorReadTimeout)
	defer cancel()
	f, _, err := s.Floor(ctx)
	if err != nil {
		return err
	}
	release, gen := Announcement()
	return TooOld(f, what, gen, release)
}

// ServerRecord is a control server's announcement: which release and
// generation it runs, written at start and again every Interval. A control
// server of a release before announcements writes none: a reader cannot
// tell from these records alone that no old server runs (see
// control/controlplane's announce.go). Key: ServerKey(name).
type ServerRecord struct {
	Version    int       `json:"version"`
	Name       string    `json:"name"`
	Release    string    `json:"release"`
	Generation int       `json:"generation"`
	Arch       string    `json:"arch,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	At         time.Time `json:"at"`
	Interval   Duration  `json:"interval"`
}

func (r *ServerRecord) version() int { return r.Version }

// KeyOK checks that the record is filed under its server's name.
func (r *ServerRecord) KeyOK(key string) error { return keyMust(key, ServerKey(r.Name)) }

// ServerKey is the meta bucket key of control server name: its name with
// every character a key token may not hold made '-'.
func ServerKey(name string) string {
	return "server." + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, name)
}

// Fresh reports whether the server announced itself within three of its
// intervals of now: a server that stopped is no longer counted.
func (r *ServerRecord) Fresh(now time.Time) bool {
	iv := time.Duration(r.Interval)
	if iv <= 0 {
		iv = DefaultBeatInterval
	}
	return now.Sub(r.At) < 3*iv
}

// PutServerRecord announces control server name, started at started, to
// announce itself again every interval.
func (s *Store) PutServerRecord(ctx context.Context, name string, started time.Time, interval time.Duration) error {
	release, gen := Announcement()
	r := &ServerRecord{Version: RecordVersion, Name: name, Release: release, Generation: gen, Arch: version.Arch(),
		StartedAt: started, At: time.Now().UTC(), Interval: Duration(interval)}
	if _, err := PutJSON(ctx, s.meta, ServerKey(name), r); err != nil {
		return fmt.Errorf("announcing control server %s: %w", name, err)
	}
	return nil
}

// ListServerRecords calls fn with every control server's announcement,
// fresh or not.
func (s *Store) ListServerRecords(ctx context.Context, fn func(*ServerRecord) error) error {
	return ListJSON(ctx, s, s.meta, "server.>", func(_ string, r *ServerRecord) error { return fn(r) })
}

// RefuseTooOld passes on the store a CLI connected to, or closes it and
// refuses it, too_old, when the store's floor is above this build's
// generation: a CLI of a release before the one the store needs would read
// (and write) a layout it does not know, as readers of generation 1 read
// instance states from records agents no longer write. A floor that cannot
// be read (a store provisioned before floors) refuses nothing.
func RefuseTooOld(s *Store, err error) (*Store, error) {
	if err != nil {
		return nil, err
	}
	if err := s.CheckFloor(context.Background(), "control cli"); HasCode(err, CodeTooOld) {
		s.NC.Close()
		return nil, err
	}
	return s, nil
}
