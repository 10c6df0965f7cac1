package storage

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// bootEncryptedBox boots a single box as `control server --auth on
// --encrypt on` does, its store encrypted at rest with keyFile.
func bootEncryptedBox(tb testing.TB, dir, authDir, keyFile string) *storagenode.Node {
	tb.Helper()
	names, _ := store.NewNames("", "")
	n, err := storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: dir, Listen: "127.0.0.1:0", Names: names,
		Auth: storagenode.AuthOn, AuthDir: authDir, TLS: storagenode.ToggleOff, Encrypt: storagenode.ToggleOn, StoreKeyFile: keyFile})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.Close)
	return n
}

// BenchmarkBackupFleet is the backup goal: a box whose store is
// encrypted at rest, holding BACKUP_MACHINES (default 10,000) simulated
// machines and BACKUP_NAMESPACES (default 1,000) deployments of 10
// instances with their churned states, final commits and routing events,
// is backed up (sealed) while the
// fleet keeps beating, then restored into a fresh box on the same auth dir
// and key. Goals: backup ≤ 30 s, restore ≤ 60 s.
//
//	go test -run '^$' -bench BenchmarkBackupFleet -benchtime 1x ./control/storage/
func BenchmarkBackupFleet(b *testing.B) {
	machines, namespaces := envInt(b, "BACKUP_MACHINES", 10000), envInt(b, "BACKUP_NAMESPACES", 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := b.TempDir()
	authDir, keyFile := filepath.Join(dir, "auth"), filepath.Join(dir, "jetstream.key")
	if err := os.WriteFile(keyFile, []byte(rand.Text()+rand.Text()+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	src := bootEncryptedBox(b, filepath.Join(dir, "a"), authDir, keyFile)
	t0 := time.Now()
	f, err := fleetsim.Start(ctx, src.Store, fleetsim.Config{Machines: machines})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Stop()
	if err := f.Place(ctx, namespaces, 10); err != nil {
		b.Fatal(err)
	}
	if _, err := f.Churn(ctx, 2000, 5*time.Second, 1, nil); err != nil {
		b.Fatal(err)
	}
	// Each deployment's final commit and routing events too, signed as
	// a control server signs them: what a gateway loads.
	if _, err := signers.Server(ctx, src.Store, authDir, filepath.Join(dir, "a"), "bench"); err != nil {
		b.Fatal(err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for n := range namespaces {
		g.Go(func() error {
			ns := fmt.Sprintf("ns%04d", n)
			svc := storetest.Service{Routes: []store.Route{{Hosts: []string{ns + ".example.com"}}}}
			for i := range 10 {
				svc.Instances = append(svc.Instances, storetest.Instance{ID: fmt.Sprintf("%s-web-%d", ns, i),
					Machine: f.IDs[(n*10+i)%len(f.IDs)], Address: "127.0.0.1", Port: 20000 + i})
			}
			_, _, err := storetest.Deploy(gctx, src.Store, ns, map[string]storetest.Service{"web": svc})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d machines, %d deployments of 10 instances, churned: %s", machines, namespaces, time.Since(t0).Round(time.Millisecond))

	key, err := os.ReadFile(keyFile)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(dir, "store.backup")
	b.ResetTimer()
	var rep *BackupReport
	for range b.N {
		if rep, err = Backup(ctx, src.Store, BackupConfig{File: file, StoreKey: string(key[:len(key)-1])}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var msgs uint64
	for _, st := range rep.Streams {
		msgs += st.Messages
	}
	b.ReportMetric(rep.Took.Seconds(), "backup_s")
	b.ReportMetric(float64(rep.Bytes)/1e6, "backup_MB")
	b.Logf("backup: %d streams, %d messages, %d bytes in %s", len(rep.Streams), msgs, rep.Bytes, rep.Took.Round(time.Millisecond))

	dst := bootEncryptedBox(b, filepath.Join(dir, "b"), authDir, keyFile)
	rrep, err := Restore(ctx, dst.Store, RestoreConfig{File: file, StoreKey: string(key[:len(key)-1])})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rrep.Took.Seconds(), "restore_s")
	b.Logf("restore: %d streams restored, %d already, %d skipped in %s", len(rrep.Restored), len(rrep.Already), len(rrep.Skipped), rrep.Took.Round(time.Millisecond))
	for _, r := range rrep.Restored {
		b.Logf("  %s: %d messages, %d bytes, %s", r.Stream, r.Messages, r.Bytes, r.Took.Round(time.Millisecond))
	}
	ci, err := dst.Store.StreamInfo(ctx, "KV_"+dst.Store.Names.InstancesBucket())
	if err != nil || ci.State.Msgs < uint64(namespaces*10) {
		b.Fatalf("restored instances: %+v, %v", ci, err)
	}
}

// envInt is the environment variable name as a number, def when unset.
func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
