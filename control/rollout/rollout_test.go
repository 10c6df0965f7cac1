package rollout_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/control/rollout"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A simulated fleet goes through a rollout in 10% batches: every machine
// verifies the signed release and fetches its binary from the store as an
// agent does, and ends on the new release; none is left mid-upgrade. The
// figures are the control plane's cost of a rollout (the process holds the
// storage node, the simulated agents and the rollout, so its CPU is an
// upper bound). EDGEPLANE_ROLLOUT_MACHINES sets the fleet's size (default
// 200; the figure is 1,000), EDGEPLANE_ROLLOUT_BINARY_MIB the
// size of the release's binary (default 1 MiB; control is about 40).
func TestRolloutThroughASimulatedFleet(t *testing.T) {
	n := 200
	if v, err := strconv.Atoi(os.Getenv("EDGEPLANE_ROLLOUT_MACHINES")); err == nil && v > 0 {
		n = v
	}
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Each simulated agent on its own connection, as machines are: the
	// fetches of a batch are spread over them, not queued on one.
	dial := func(ctx context.Context, machine string) (*store.Store, error) {
		nc, err := store.Connect(store.ConnectOptions{URL: srv.URL, Name: machine})
		if err != nil {
			return nil, err
		}
		return store.Open(ctx, nc, srv.Store.Names)
	}
	fleet, err := fleetsim.Start(ctx, srv.Connect(t), fleetsim.Config{Machines: n, Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()
	size := 1
	if v, err := strconv.Atoi(os.Getenv("EDGEPLANE_ROLLOUT_BINARY_MIB")); err == nil && v > 0 {
		size = v
	}
	bin := make([]byte, size<<20)
	rand.Read(bin)
	if err := srv.Store.PushRelease(ctx, &store.ReleaseRecord{Release: "1.1.0", Arch: version.Arch()},
		map[string]io.Reader{"control": bytes.NewReader(bin)}); err != nil {
		t.Fatal(err)
	}

	batch := max(1, n/10)
	var steps int
	cpu0, start := cpuTime(), time.Now()
	res, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: "1.1.0", Canary: 1, Batch: batch, MaxUnavailable: batch,
		HealthBound: 30 * time.Second, Progress: func(rollout.Step) { steps++ }})
	took, cpu := time.Since(start), cpuTime()-cpu0
	if err != nil {
		t.Fatal(err)
	}
	rel := fleet.Releases()
	t.Logf("%d simulated machines 1.0.0 → 1.1.0 in batches of %d (1 canary): %s, process CPU %s (%s per machine), %d MiB of release fetched, %d progress steps",
		n, batch, took.Round(time.Millisecond), cpu.Round(time.Millisecond), (cpu / time.Duration(n)).Round(time.Microsecond), fleet.Fetched.Load()>>20, steps)
	if len(res.Upgraded) != n || rel["1.1.0"] != n || len(rel) != 1 {
		t.Fatalf("upgraded %d of %d; releases now %v; skipped %v", len(res.Upgraded), n, rel, res.Skipped)
	}
	if r, err := srv.Store.LatestRollout(ctx); err != nil || r == nil || r.ID != res.Rollout || r.State != store.RolloutDone || r.Upgraded != n || r.Total != n {
		t.Fatalf("the rollout's record: %+v %v", r, err)
	}
	if fleet.Fetched.Load() != int64(n)*int64(len(bin)) {
		t.Fatalf("fetched %d bytes, want %d", fleet.Fetched.Load(), int64(n)*int64(len(bin)))
	}

	// Again: nothing to do, every machine already on it.
	res, err = rollout.Run(ctx, srv.Store, rollout.Options{Release: "1.1.0"})
	if err != nil || len(res.Current) != n || len(res.Upgraded) != 0 {
		t.Fatalf("second rollout: %+v %v", res, err)
	}
	// Refused up front, nothing asked of any machine: a release never
	// pushed, a machine that does not exist, a bad option; and a second
	// rollout while one holds the lease.
	if _, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: "9.9.9"}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a rollout of a release never pushed: %v", err)
	}
	if _, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: "1.1.0", Machines: []string{fleet.IDs[0], "nope"}}); !store.HasCode(err, store.CodeNotFound) || !strings.Contains(err.Error(), "no machine nope") {
		t.Fatalf("a rollout naming an unknown machine: %v", err)
	}
	for _, o := range []rollout.Options{{Release: "latest"}, {Release: "1.1.0", Canary: -1}} {
		if _, err := rollout.Run(ctx, srv.Store, o); !store.HasCode(err, store.CodeInvalid) {
			t.Fatalf("rollout %+v: %v, want invalid", o, err)
		}
	}
	if got := fleet.Releases(); got["1.1.0"] != n || len(got) != 1 {
		t.Fatalf("refused rollouts changed the fleet: %v", got)
	}
	lease, err := srv.Store.AcquireLease(ctx, rollout.LockKey, store.LeaseOptions{TTL: 10 * time.Second, Holder: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if _, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: "1.1.0"}); !store.HasCode(err, store.CodeBusy) {
		t.Fatalf("a second rollout at once: %v, want busy", err)
	}
}
