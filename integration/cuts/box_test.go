package cuts_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/internal/powercut"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// box is a single box whose storage node keeps its data directory on a
// powercut mount. The control server's own files (its signer, the trust
// root) live off the mount: what is cut is the store.
type box struct {
	t                    *testing.T
	backing, mnt, ctlDir string
	addr                 string
	fs                   *powercut.FS
	ns                   *server.Server
}

// newBox mounts a fresh power-cut disk and starts a storage node on it;
// the test is skipped where powercut cannot mount.
func newBox(t *testing.T) *box {
	t.Helper()
	if err := powercut.Available(); err != nil {
		t.Skipf("skipped: %v", err)
	}
	dir := t.TempDir()
	b := &box{t: t, backing: filepath.Join(dir, "disk"), mnt: filepath.Join(dir, "mnt"), ctlDir: filepath.Join(dir, "control"),
		addr: storetest.FreeAddr(t)}
	for _, d := range []string{b.backing, b.mnt, b.ctlDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b.boot()
	t.Cleanup(b.halt)
	return b
}

// boot mounts the disk and starts the storage node on it, as a box
// coming up.
func (b *box) boot() {
	b.t.Helper()
	var err error
	if b.fs, err = powercut.Mount(b.backing, b.mnt); err != nil {
		b.t.Fatal(err)
	}
	if b.ns, err = storagenode.Start(storagenode.Config{DataDir: b.mnt, Listen: b.addr, ServerName: "box"}); err != nil {
		b.fs.Unmount()
		b.t.Fatalf("booting the storage node after a cut: %v", err)
	}
}

// powerOff cuts the power: what was not synced is undone and the disk
// answers nothing more; the storage node, dead with it, is stopped.
func (b *box) powerOff() {
	b.t.Helper()
	if err := b.fs.Cut(); err != nil {
		b.t.Fatalf("cutting power: %v", err)
	}
	b.ns.Shutdown()
	b.ns.WaitForShutdown()
	<-b.fs.Done()
}

// halt shuts down cleanly at the end of the test.
func (b *box) halt() {
	if b.ns != nil {
		b.ns.Shutdown()
		b.ns.WaitForShutdown()
	}
	if b.fs != nil {
		if err := b.fs.Unmount(); err != nil {
			b.t.Error(err)
		}
	}
}

// url is where the box's storage node listens, across reboots.
func (b *box) url() string { return "nats://" + b.addr }

// connect opens a provisioned store on urls as the control server does:
// provisioned (the layout created where a cut lost it) and signing with
// the control server's signer. It reconnects quickly and forever, as
// long-running processes do.
func connect(t *testing.T, urls, ctlDir, name string, replicas int) *store.Store {
	t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: urls, Name: name, ReconnectForever: true,
		ReconnectDelay: func(int) time.Duration { return 50 * time.Millisecond }})
	if err != nil {
		t.Fatalf("connecting %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := store.WaitForJetStream(ctx, nc); err != nil {
		t.Fatal(err)
	}
	names, _ := store.NewNames("", "")
	var s *store.Store
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		s, err = store.Provision(pctx, nc, names, store.Layout{Replicas: replicas})
		pcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("provisioning the store (%s) for a minute: %v", name, err)
		}
	}
	if _, err := signers.Server(ctx, s, filepath.Join(ctlDir, "auth"), ctlDir, name); err != nil {
		t.Fatalf("signing keys: %v", err)
	}
	return s
}

// seed is CUTS_SEED, or a new one; the test logs it so that a failure
// can be repeated.
func seed(t *testing.T) uint64 {
	t.Helper()
	if v := os.Getenv("CUTS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CUTS_SEED=%q: %v", v, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// fence tells what a store acknowledged before the power went from what
// came after: a disk without power acknowledges nothing, but the
// simulator's server lives on (answering from what it still holds, its
// files failing), so an acknowledgement that arrives after the cut does
// not count. An acknowledgement that arrives before it counts: the
// store had synced it.
type fence struct {
	mu  sync.Mutex
	off bool
}

// ack runs record if the power was still on.
func (f *fence) ack(record func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.off {
		record()
	}
}

// cutting runs cut with the fence closed behind it.
func (f *fence) cutting(cut func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cut()
	f.off = true
}

// scenario is work done on a box and what must hold after each cut.
type scenario struct {
	// cuts is how many times the power goes; window is how long after
	// the work starts it may go (uniformly): a few rounds of the work,
	// so that cuts land at every point of it.
	cuts   int
	window time.Duration
	// work runs on the box's store until ctx ends (the power went); it
	// reports what the store acknowledged through ack.
	work func(ctx context.Context, s *store.Store, rng *rand.Rand, ack func(record func()))
	// check runs on the box's store after each reboot; what fails names
	// the cut and the seed.
	check func(ctx context.Context, t *testing.T, s *store.Store, cut string)
}

// cutPower runs sc on the box: work, a cut at a seeded random point, a
// reboot, the check; sc.cuts times. Processes of the box die with it (its
// store connection is closed at the cut, an apply killed with it); what
// other boxes run keeps its own connections.
func (b *box) cutPower(t *testing.T, sc scenario) {
	sd := seed(t)
	t.Logf("seed %d (CUTS_SEED=%d repeats this run)", sd, sd)
	rng := rand.New(rand.NewPCG(sd, 0))
	start := time.Now()
	s := connect(t, b.url(), b.ctlDir, "box", 1)
	var took timings
	for i := range sc.cuts {
		took.add(runCut(t, sc, rng, func() { b.powerOff() }, &s, func() *store.Store {
			b.boot()
			return connect(t, b.url(), b.ctlDir, "box", 1)
		}, fmt.Sprintf("cut %d of %d (seed %d)", i+1, sc.cuts, sd)))
		if t.Failed() {
			return
		}
	}
	t.Logf("%d cuts in %s: %s", sc.cuts, time.Since(start).Round(time.Millisecond), took)
}

// timings are where a run's time went: working until the cut, the cut
// and reboot, the checks.
type timings struct{ work, reboot, check time.Duration }

func (a *timings) add(b timings) {
	a.work, a.reboot, a.check = a.work+b.work, a.reboot+b.reboot, a.check+b.check
}

func (a timings) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%s working, %s cutting and rebooting, %s checking", r(a.work), r(a.reboot), r(a.check))
}

// runCut is one round of sc: work on *s, cut with powerOff at a random
// point, then reboot, and check on the store reboot returns (left in *s
// for the next round).
func runCut(t *testing.T, sc scenario, rng *rand.Rand, powerOff func(), s **store.Store, reboot func() *store.Store, name string) timings {
	t.Helper()
	return runCutAround(t, sc, rng, nil, powerOff, func() {}, s, reboot, name)
}

// runCutAround is runCut where the cut is cut (under the fence) then
// after (outside it: stopping what died), with before, if set, run at a
// random point of the work before the cut.
func runCutAround(t *testing.T, sc scenario, rng *rand.Rand, before, cut, after func(), s **store.Store, reboot func() *store.Store, name string) timings {
	t.Helper()
	var took timings
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var f fence
	done := make(chan struct{})
	workRng := rand.New(rand.NewPCG(rng.Uint64(), 1))
	cur := *s
	go func() {
		defer close(done)
		sc.work(ctx, cur, workRng, f.ack)
	}()
	at := time.Duration(rng.Int64N(int64(sc.window)))
	if before != nil {
		early := time.Duration(rng.Int64N(int64(at) + 1))
		time.Sleep(early)
		before()
		at -= early
	}
	time.Sleep(at)
	took.work = time.Since(began)
	f.cutting(cut)
	after()
	cur.NC.Close()
	cancel()
	<-done
	*s = reboot()
	took.reboot = time.Since(began) - took.work
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	sc.check(cctx, t, *s, name)
	took.check = time.Since(began) - took.work - took.reboot
	return took
}
