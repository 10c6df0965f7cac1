package storagenode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const (
	testStream = "T"
	// testMsgs of about 400 bytes fill several of the 32 KiB blocks the
	// server picks for a stream of testMaxBytes.
	testMsgs     = 200
	testMaxBytes = 120 << 10
)

var testKey = strings.Repeat("k", 32)

// fillStream creates the test stream with replicas on ns and publishes
// testMsgs messages, each naming its sequence.
func fillStream(t *testing.T, ns *server.Server, replicas int, compression ...jetstream.StoreCompression) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// A cluster elects its meta leader first, and may still be placing.
	if err := store.WaitForJetStream(ctx, nc); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 20*time.Second, "the test stream created", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		cfg := jetstream.StreamConfig{Name: testStream, Subjects: []string{"t.>"}, MaxBytes: testMaxBytes, Replicas: replicas}
		if len(compression) > 0 {
			cfg.Compression = compression[0]
		}
		_, err := js.CreateStream(cctx, cfg)
		return err == nil
	})
	pad := strings.Repeat("x", 380)
	for i := 1; i <= testMsgs; i++ {
		if _, err := js.Publish(ctx, fmt.Sprintf("t.%d", i), []byte(fmt.Sprintf("%d %s", i, pad))); err != nil {
			t.Fatal(err)
		}
	}
}

// blocks lists the test stream's block files under dataDir, in order.
func blocks(t *testing.T, dataDir string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dataDir, "jetstream", "jetstream", "*", "streams", testStream, "msgs", "*.blk"))
	sort.Slice(files, func(i, j int) bool {
		var a, b int
		fmt.Sscanf(filepath.Base(files[i]), "%d.blk", &a)
		fmt.Sscanf(filepath.Base(files[j]), "%d.blk", &b)
		return a < b
	})
	if len(files) < 2 {
		t.Fatalf("the test stream should span several blocks: %v", files)
	}
	return files
}

// flipBit flips a bit in the middle of the first block.
func flipBit(t *testing.T, blocks []string) string {
	t.Helper()
	file := blocks[0]
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// truncateFirst cuts the first block to half its size.
func truncateFirst(t *testing.T, blocks []string) string { return truncateHalf(t, blocks[0]) }

// truncateLast cuts the last block to about half its size: what is left
// ends in a partial record, as an interrupted append would, but the
// stream's index knew what followed. (A cut exactly between two records of
// the last block is not seen: see CheckStore. Half of this one is such a
// cut, so it cuts a little more.)
func truncateLast(t *testing.T, blocks []string) string {
	return truncateTo(t, blocks[len(blocks)-1], 0.45)
}

func truncateHalf(t *testing.T, file string) string { return truncateTo(t, file, 0.5) }

func truncateTo(t *testing.T, file string, part float64) string {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, int64(float64(fi.Size())*part)); err != nil {
		t.Fatal(err)
	}
	return file
}

// A single box whose store has a damaged block refuses to start, naming
// the file and the stream and sending the operator to a backup; the refusal
// holds on the next start (nothing was repaired into a hole). Each damage,
// encrypted at rest and not.
func TestSingleBoxWithDamagedBlockRefusesToStart(t *testing.T) {
	for _, tc := range []struct {
		name       string
		key        string
		damage     func(*testing.T, []string) string
		compressed bool
	}{
		{"flipped bit, encrypted", testKey, flipBit, false},
		{"flipped bit, plaintext", "", flipBit, false},
		{"flipped bit, compressed", "", flipBit, true},
		{"truncated block, encrypted", testKey, truncateFirst, false},
		{"truncated last block, encrypted", testKey, truncateLast, false},
		{"truncated last block, plaintext", "", truncateLast, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", StoreKey: tc.key}
			ns, err := storagenode.Start(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tc.compressed {
				fillStream(t, ns, 1, jetstream.S2Compression)
			} else {
				fillStream(t, ns, 1)
			}
			ns.Shutdown()
			ns.WaitForShutdown()
			if b, _ := os.ReadFile(blocks(t, dir)[0]); tc.compressed && !strings.HasPrefix(string(b), "cmp") {
				t.Fatal("block 1 is not compressed")
			}
			// A clean store starts again: the check finds nothing in a
			// healthy one.
			if ns, err = storagenode.Start(cfg); err != nil {
				t.Fatalf("healthy store: %v", err)
			}
			ns.Shutdown()
			ns.WaitForShutdown()

			damaged := tc.damage(t, blocks(t, dir))
			for range 2 {
				ns, err := storagenode.Start(cfg)
				if err == nil {
					ns.Shutdown()
					t.Fatalf("started with a damaged %s", damaged)
				}
				se := store.AsError(err)
				if se.Code != store.CodeStoreDamaged || se.Detail["file"] != damaged || se.Detail["stream"] != testStream ||
					!strings.Contains(se.Message, damaged) || !strings.Contains(se.Message, "control storage restore") {
					t.Fatalf("refusal: %v %+v", err, se.Detail)
				}
				t.Logf("refused: %v", err)
			}
		})
	}
}

// What a power cut leaves of an append, a partial record at the end of the
// stream's last block that its index never knew of, is not damage: it was
// never acknowledged, and the server drops it as it starts.
func TestTornTailOfLastBlockStarts(t *testing.T) {
	dir := t.TempDir()
	cfg := storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", StoreKey: testKey}
	ns, err := storagenode.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fillStream(t, ns, 1)
	ns.Shutdown()
	ns.WaitForShutdown()
	files := blocks(t, dir)
	last := files[len(files)-1]
	fi, _ := os.Stat(last)
	if err := os.Truncate(last, fi.Size()-10); err != nil {
		t.Fatal(err)
	}
	// The index knew the last message: that is a truncated file.
	if d, err := storagenode.CheckStore(dir, testKey); err != nil || len(d) != 1 || d[0].File != last || !strings.Contains(d[0].Problem, "index.db knew messages up to sequence 200") {
		t.Fatalf("truncated by 10 bytes: %v, %v", d, err)
	}
	// The server wrote its index before the last append.
	if err := os.Remove(filepath.Join(filepath.Dir(last), "index.db")); err != nil {
		t.Fatal(err)
	}
	if d, err := storagenode.CheckStore(dir, testKey); err != nil || len(d) != 0 {
		t.Fatalf("torn tail: %v, %v", d, err)
	}
	// The check decrypts: with another key, no block opens.
	if d, err := storagenode.CheckStore(dir, strings.Repeat("x", 32)); err != nil || len(d) != len(files) || !strings.Contains(d[0].Problem, "does not open with the store key") {
		t.Fatalf("another key: %v, %v", d, err)
	}
	ns, err = storagenode.Start(cfg)
	if err != nil {
		t.Fatalf("torn tail refused: %v", err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
}

// localStream is the test stream's replica as ns sees its own copy.
func localStream(t *testing.T, ns *server.Server) store.StreamReplica {
	t.Helper()
	st, err := storagenode.LocalStatus(ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Streams {
		if r.Name == testStream {
			return r
		}
	}
	return store.StreamReplica{}
}

// One node of three with a damaged block rebuilds its copy from its peers
// as it starts, instead of serving holes: afterwards it holds every
// message, serves them all as the stream's leader, says it rebuilt, and
// its store checks clean.
func TestDamagedReplicaRebuiltFromPeers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(*testing.T, []string) string
	}{
		{"flipped bit", flipBit},
		{"truncated block", truncateFirst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs := make([]storagenode.Config, 3)
			nodes := startOnFreePorts(t, func(i int, routes []string) storagenode.Config {
				cfgs[i] = storagenode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: fmt.Sprintf("s%d", i+1), StoreKey: testKey,
					Cluster: &storagenode.ClusterConfig{Name: "edge", Listen: routes[i], Routes: routes}}
				return cfgs[i]
			})
			fillStream(t, nodes[0], 3)
			s3 := nodes[2]
			storetest.Eventually(t, 20*time.Second, "s3's copy complete", func() bool { return localStream(t, s3).Msgs == testMsgs })
			s3.Shutdown()
			s3.WaitForShutdown()

			damaged := tc.damage(t, blocks(t, cfgs[2].DataDir))
			s3, err := storagenode.Start(cfgs[2])
			if err != nil {
				t.Fatalf("a damaged replica with two peers holding the stream: %v", err)
			}
			nodes[2] = s3
			var r store.StreamReplica
			storetest.Eventually(t, 30*time.Second, "s3's copy rebuilt", func() bool {
				r = localStream(t, s3)
				return r.Msgs == testMsgs && r.FirstSeq == 1 && r.LastSeq == testMsgs
			})
			if r.Rebuilt == nil || !strings.Contains(r.Damage, damaged) || r.Lost != 0 {
				t.Fatalf("s3 reports %+v", r)
			}
			// s3 serves every message from its own copy as the leader.
			nc, err := store.Connect(store.ConnectOptions{URL: s3.ClientURL()})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			js, _ := jetstream.New(nc)
			stream, err := js.Stream(ctx, testStream)
			if err != nil {
				t.Fatal(err)
			}
			storetest.Eventually(t, 20*time.Second, "s3 leads the stream", func() bool {
				// Unanswered while the stream elects a leader.
				ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				info, err := stream.Info(ictx)
				if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
					return false
				}
				if info.Cluster.Leader == "s3" {
					return true
				}
				_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+testStream, []byte(`{"placement":{"preferred":"s3"}}`), 2*time.Second)
				return false
			})
			for seq := uint64(1); seq <= testMsgs; seq++ {
				m, err := stream.GetMsg(ctx, seq)
				if err != nil || !strings.HasPrefix(string(m.Data), fmt.Sprintf("%d ", seq)) {
					t.Fatalf("message %d from s3: %v", seq, err)
				}
			}
			nc.Close()
			s3.Shutdown()
			s3.WaitForShutdown()
			if d, err := storagenode.CheckStore(cfgs[2].DataDir, testKey); err != nil || len(d) != 0 {
				t.Fatalf("s3's rebuilt store: %v, %v", d, err)
			}
			q, _ := filepath.Glob(filepath.Join(cfgs[2].DataDir, storagenode.QuarantineDir, "*", "damage.json"))
			if len(q) != 1 {
				t.Fatalf("quarantine records: %v", q)
			}
		})
	}
}

// `control server` on a single box (Boot, with credentials and its
// encrypted store) refuses to start over a damaged block with the
// structured refusal, and lets go of the data dir so a restore can take
// it.
func TestBootRefusesDamagedStore(t *testing.T) {
	dataDir := t.TempDir()
	cfg := storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: t.TempDir()}
	n := boot(t, cfg)
	for i := range 20 {
		putSecretN(t, n, i)
	}
	n.Close()
	files, _ := filepath.Glob(filepath.Join(dataDir, "jetstream", "jetstream", "*", "streams", "*", "msgs", "*.blk"))
	var damaged string
	var size int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Size() > size {
			damaged, size = f, fi.Size()
		}
	}
	b, _ := os.ReadFile(damaged)
	b[len(b)/2] ^= 0x04
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := storagenode.Boot(t.Context(), cfg)
	if se := store.AsError(err); se.Code != store.CodeStoreDamaged || se.Detail["file"] != damaged {
		t.Fatalf("boot over %s: %v", damaged, err)
	}
	release, err := storagenode.LockDataDir(dataDir)
	if err != nil {
		t.Fatalf("the refused start kept the data dir: %v", err)
	}
	release()
}

func putSecretN(t *testing.T, n *storagenode.Node, i int) {
	t.Helper()
	b := storetest.Bucket(t, n.Store, n.Store.Names.CertsBucket())
	if _, err := b.Put(context.Background(), fmt.Sprintf("certificates/%d.example.com.key", i), []byte(secret)); err != nil {
		t.Fatal(err)
	}
}
