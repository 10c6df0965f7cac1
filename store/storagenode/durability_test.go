package storagenode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/internal/powercut"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func TestParseSync(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"always", 0, true},
		{"", 0, true},
		{"2m", 2 * time.Minute, true},
		{"150ms", 150 * time.Millisecond, true},
		{"0s", 0, false},
		{"-1m", 0, false},
		{"never", 0, false},
		{"2", 0, false},
	} {
		got, err := storagenode.ParseSync(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseSync(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if !tc.ok && (err == nil || store.AsError(err).Code != store.CodeInvalid) {
			t.Errorf("ParseSync(%q) = %v, %v; want an invalid error", tc.in, got, err)
		}
	}
}

// singleNode starts a single storage node with the default sync policy and
// connects to it; both end with the test.
func singleNode(t *testing.T) *nats.Conn {
	t.Helper()
	ns, err := storagenode.Start(storagenode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A single box provisions each stream and bucket with the persist mode its
// durability asks: the rewritten observations async, every other synced.
func TestProvisionedPersistModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := singleNode(t)
	s, err := store.Provision(ctx, nc, testNames(t), store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rewritten := 0
	for name, d := range s.Durabilities() {
		str, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want := jetstream.DefaultPersistMode
		if d == store.DurabilityRewritten {
			want = jetstream.AsyncPersistMode
			rewritten++
		}
		if got := str.CachedInfo().Config.PersistMode; got != want {
			t.Errorf("%s (%s): persist mode %v, want %v", name, d, got, want)
		}
	}
	if rewritten == 0 {
		t.Fatal("no rewritten bucket provisioned async")
	}
	// Provisioning again (every start) changes nothing and fails nothing.
	if _, err := store.Provision(ctx, nc, testNames(t), store.Layout{}); err != nil {
		t.Fatalf("provisioning again: %v", err)
	}
}

// A store provisioned before the durabilities had every stream synced, and
// JetStream cannot change a stream's persist mode: an upgraded single box
// recreates its rewritten buckets unsynced at the sequence after their last,
// so that a process watching one across the upgrade, which resumes after the
// last sequence it saw, misses nothing written after (nats.go's ordered
// consumer notices the new stream by its missed heartbeats, some 20 s on).
// Each key keeps its value through it (a machine's heartbeat read empty
// says it was never seen, and is never judged down); a deleted one stays
// so.
func TestUpgradedStoreGetsTheSyncPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := singleNode(t)
	names := testNames(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The store as an older release left it: every bucket synced, the
	// machine beats holding a few.
	s, err := store.Provision(ctx, nc, names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	beats := "KV_" + names.MachineBeatsBucket()
	{
		str, err := js.Stream(ctx, beats)
		if err != nil {
			t.Fatal(err)
		}
		cfg := str.CachedInfo().Config
		cfg.PersistMode = jetstream.DefaultPersistMode
		if _, err := js.UpdateStream(ctx, cfg); err == nil {
			t.Fatal("JetStream changed a stream's persist mode: recreating it is no longer needed")
		}
		if err := js.DeleteStream(ctx, beats); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := s.PutMachineBeat(ctx, fmt.Sprintf("m%d", i), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	beatsKV, err := js.KeyValue(ctx, names.MachineBeatsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := beatsKV.Delete(ctx, "m2"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMachineBeat(ctx, "m1", 2*time.Second); err != nil { // m1's second beat: its last is kept
		t.Fatal(err)
	}
	lastSeq := uint64(5)
	if _, err := store.Provision(ctx, nc, names, store.Layout{}); err != nil {
		t.Fatalf("provisioning the upgraded store: %v", err)
	}
	str, err := js.Stream(ctx, beats)
	if err != nil {
		t.Fatal(err)
	}
	if got := str.CachedInfo().Config.PersistMode; got != jetstream.AsyncPersistMode {
		t.Fatalf("upgraded %s: persist mode %v, want async", beats, got)
	}
	if first := str.CachedInfo().State.FirstSeq; first != lastSeq+1 {
		t.Errorf("upgraded %s starts at sequence %d, want %d (after the old one's last)", beats, first, lastSeq+1)
	}
	// What each key held is there; the deleted one is not.
	if b, err := s.MachineBeatOf(ctx, "m0"); err != nil || time.Duration(b.Interval) != time.Second {
		t.Errorf("m0's beat after the upgrade: %+v, %v", b, err)
	}
	if b, err := s.MachineBeatOf(ctx, "m1"); err != nil || time.Duration(b.Interval) != 2*time.Second {
		t.Errorf("m1's beat after the upgrade: %+v, %v; want its last (interval 2s)", b, err)
	}
	if b, err := s.MachineBeatOf(ctx, "m2"); !store.HasCode(err, store.CodeNotFound) {
		t.Errorf("m2's beat, deleted before the upgrade, reads %+v, %v; want not found", b, err)
	}
	// Writers go on: a put lands in the new stream, after the old ones.
	if err := s.PutMachineBeat(ctx, "m9", time.Second); err != nil {
		t.Fatal(err)
	}
	if b, err := s.MachineBeatOf(ctx, "m9"); err != nil || b == nil {
		t.Fatalf("a beat written after the upgrade: %v, %v", b, err)
	}
}

// cutWrites are the records written before a power cut, through the store's
// typed API, each kind n times.
type cutWrites struct {
	n     int
	users []string
}

// write writes n of every kind, each acknowledged.
func (w *cutWrites) write(ctx context.Context, t *testing.T, s *store.Store) {
	t.Helper()
	for i := range w.n {
		host := fmt.Sprintf("h%d.example.com", i)
		if err := s.PutHostClaim(ctx, &store.HostClaim{Host: host, Namespace: "shop", Since: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutCert(ctx, "cert."+host+".crt", []byte("PEM "+host)); err != nil {
			t.Fatal(err)
		}
		c := &store.DeployCommit{ID: fmt.Sprintf("d%d", i), Namespace: "shop", Kind: store.CommitFinal, Revision: int64(i + 1),
			Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}}}}
		if _, err := s.AppendCommit(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeUser(ctx, &store.Revocation{User: w.users[i], Reason: "cut test"}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateMachine(ctx, &store.MachineRecord{ID: fmt.Sprintf("m%d", i), State: store.MachineActive}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutInstance(ctx, &store.InstanceRecord{ID: fmt.Sprintf("i%d", i), Namespace: "shop", Service: "web",
			Machine: fmt.Sprintf("m%d", i), State: store.InstanceReady}); err != nil {
			t.Fatal(err)
		}
	}
}

// kept counts, per kind, the records of write that s holds.
func (w *cutWrites) kept(ctx context.Context, t *testing.T, s *store.Store) map[string]int {
	t.Helper()
	kept := map[string]int{}
	for i := range w.n {
		host := fmt.Sprintf("h%d.example.com", i)
		if c, err := s.HostClaims(ctx, []string{store.HostKey(host)}, nil); err == nil && len(c) == 1 {
			kept["host claims"]++
		}
		if e, err := s.GetCert(ctx, "cert."+host+".crt"); err == nil && string(e.Value()) == "PEM "+host {
			kept["certificates"]++
		}
		if r, err := s.UserRevoked(ctx, w.users[i]); err == nil && r {
			kept["revocations"]++
		}
		if _, _, err := s.GetMachine(ctx, fmt.Sprintf("m%d", i)); err == nil {
			kept["machines"]++
		}
		if _, _, err := s.GetInstance(ctx, store.InstanceKey("shop", fmt.Sprintf("m%d", i), fmt.Sprintf("i%d", i))); err == nil {
			kept["instances"]++
		}
	}
	if good, _, err := s.CommitHistory(ctx, "shop"); err == nil {
		kept["commits"] = len(good)
	}
	return kept
}

// startOn starts a default single storage node on dataDir with sync, and
// provisions it as `control server` does at every start.
func startOn(ctx context.Context, t *testing.T, dataDir, authDir string, sync time.Duration) (*server.Server, *nats.Conn, *store.Store, error) {
	t.Helper()
	ns, err := storagenode.Start(storagenode.Config{DataDir: dataDir, Listen: "127.0.0.1:0", SyncInterval: sync})
	if err != nil {
		return nil, nil, nil, err
	}
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL()})
	if err != nil {
		ns.Shutdown()
		return nil, nil, nil, err
	}
	s, err := store.Provision(ctx, nc, testNames(t), store.Layout{})
	if err == nil {
		_, err = signers.Server(ctx, s, authDir, authDir, "box")
	}
	if err != nil {
		nc.Close()
		ns.Shutdown()
		return nil, nil, nil, err
	}
	return ns, nc, s, nil
}

// A single box on the power-cut simulator: what the store acknowledged (a
// host claim, a certificate, a commit, a revocation, a machine, an
// instance record) is all there after a cut and a restart from what the
// disk held, with the default sync policy. With an interval instead the
// test says how many were lost, without failing: that is the trade the
// interval makes.
func TestAcknowledgedWritesSurviveAPowerCut(t *testing.T) {
	if err := powercut.Available(); err != nil {
		t.Skipf("skipped: no power-cut simulator here: %v", err)
	}
	for _, tc := range []struct {
		name string
		sync time.Duration
	}{
		{"always", 0},
		{"interval-2m", 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			backing, mnt, authDir := filepath.Join(dir, "disk"), filepath.Join(dir, "mnt"), filepath.Join(dir, "auth")
			for _, d := range []string{backing, mnt, authDir} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			f, err := powercut.Mount(backing, mnt)
			if err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(mnt, "data")
			ns, nc, s, err := startOn(ctx, t, data, authDir, tc.sync)
			if err != nil {
				f.Unmount()
				t.Fatal(err)
			}
			w := &cutWrites{n: 10}
			for range w.n {
				kp, err := nkeys.CreateUser()
				if err != nil {
					t.Fatal(err)
				}
				pub, _ := kp.PublicKey()
				w.users = append(w.users, pub)
			}
			w.write(ctx, t, s)
			// Observations: unsynced on a single box, and harmless to lose.
			for i := range w.n {
				if err := s.PutMachineBeat(ctx, fmt.Sprintf("m%d", i), time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Cut(); err != nil {
				t.Fatal(err)
			}
			nc.Close()
			ns.Shutdown()
			ns.WaitForShutdown()
			<-f.Done()

			again, err := powercut.Mount(backing, mnt)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := again.Unmount(); err != nil {
					t.Error(err)
				}
			}()
			ns2, nc2, s2, err := startOn(ctx, t, data, authDir, tc.sync)
			if err != nil {
				if tc.sync == 0 {
					t.Fatalf("restart after the cut: %v", err)
				}
				t.Logf("sync %s: the store does not start again after the cut: %v", tc.name, err)
				return
			}
			defer func() { nc2.Close(); ns2.Shutdown(); ns2.WaitForShutdown() }()
			kept := w.kept(ctx, t, s2)
			beats := 0
			for i := range w.n {
				if b, err := s2.MachineBeatOf(ctx, fmt.Sprintf("m%d", i)); err == nil && b != nil {
					beats++
				}
			}
			t.Logf("sync %s: of %d acknowledged each, kept after the cut: %v; machine beats (rewritten, may go): %d",
				tc.name, w.n, kept, beats)
			if tc.sync != 0 {
				return
			}
			for _, kind := range []string{"host claims", "certificates", "commits", "revocations", "machines", "instances"} {
				if kept[kind] != w.n {
					t.Errorf("%s: %d of %d acknowledged survived the cut", kind, kept[kind], w.n)
				}
			}
		})
	}
}

// BenchmarkSyncedVsRewrittenWrites is what the durability of a bucket costs
// a writer on a default single storage node: an instance record (synced
// before it is acknowledged) against a machine beat (rewritten, unsynced),
// one writer, each put waiting for its acknowledgement.
func BenchmarkSyncedVsRewrittenWrites(b *testing.B) {
	ctx := context.Background()
	ns, err := storagenode.Start(storagenode.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL()})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	names, _ := store.NewNames("", "")
	s, err := store.Provision(ctx, nc, names, store.Layout{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("synced=instance-record", func(b *testing.B) {
		for i := range b.N {
			if _, err := s.PutInstance(ctx, &store.InstanceRecord{ID: fmt.Sprintf("i%d", i%100), Namespace: "shop", Service: "web",
				Machine: "m1", State: store.InstanceReady, Slot: i}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rewritten=machine-beat", func(b *testing.B) {
		for i := range b.N {
			if err := s.PutMachineBeat(ctx, fmt.Sprintf("m%d", i%100), time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
}
