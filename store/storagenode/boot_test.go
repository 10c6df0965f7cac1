package storagenode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func testNames(t *testing.T) store.Names {
	t.Helper()
	names, err := store.NewNames("", "")
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// boot boots a storage node on a free loopback port, running until the
// test ends. Its names are the defaults (the zero Names).
func boot(t *testing.T, cfg storagenode.BootConfig) *storagenode.Node {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	n, err := storagenode.Boot(t.Context(), cfg)
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	t.Cleanup(n.Close)
	return n
}

// statusAnswers asks the storage status subject on n's connection.
func statusAnswers(t *testing.T, n *storagenode.Node) []store.StorageNodeStatus {
	t.Helper()
	answers, err := store.GatherStorageStatus(context.Background(), n.Conn, n.Store.Names, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return answers
}

func TestBootWithoutCredentials(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOff, Progress: &out})
	if n.Auth != nil || n.CredsFile != "" {
		t.Fatalf("auth off: node has auth %v, creds %q", n.Auth, n.CredsFile)
	}
	if _, err := os.Stat(filepath.Join(dir, storagenode.ControlCredsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("auth off wrote control credentials: %v", err)
	}
	want := []string{
		fmt.Sprintf("embedded NATS with JetStream on %s (store %s)\n", n.Server.ClientURL(), filepath.Join(dir, "jetstream")),
		"plaintext on loopback, no credentials: this store is reachable from this box only\n",
		"provisioned streams and buckets for installation local, authority default (replicas 1)\n",
	}
	if out.String() != strings.Join(want, "") {
		t.Fatalf("progress:\n%s\nwant:\n%s", out.String(), strings.Join(want, ""))
	}
	if err := n.Store.RequireQuorum(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The node answers the storage status subject, as `control storage ls`
	// asks it.
	if a := statusAnswers(t, n); len(a) != 1 || a[0].Server != "edgeplane" || a[0].MetaLeader != "edgeplane" {
		t.Fatalf("status answers: %+v", a)
	}
	// Anyone may connect to a node without credentials.
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestBootWithCredentialsWritesControlCreds(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOn, Progress: &out})
	creds := filepath.Join(dir, storagenode.ControlCredsFile)
	if n.Auth == nil || n.CredsFile != creds {
		t.Fatalf("auth on: node has auth %v, creds %q", n.Auth, n.CredsFile)
	}
	if n.Auth.Dir != filepath.Join(dir, "auth") {
		t.Fatalf("auth dir %s, want DATA/auth", n.Auth.Dir)
	}
	fi, err := os.Stat(creds)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", creds, fi.Mode().Perm())
	}
	if line := "credentials required on every connection; this node's control credentials: " + creds + "\n"; !strings.HasPrefix(out.String(), line) {
		t.Fatalf("progress:\n%s\nwant first:\n%s", out.String(), line)
	}
	// The file connects with the control role: it binds to the store.
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: creds})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := store.Open(ctx, nc, n.Store.Names); err != nil {
		t.Fatalf("binding with %s: %v", creds, err)
	}
	// Without credentials, nothing connects.
	if nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL()}); err == nil {
		nc.Close()
		t.Fatal("connected without credentials to a node that requires them")
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(matches) > 0 {
		t.Fatalf("left behind: %v", matches)
	}
}

func TestBootRefusesADataDirInUse(t *testing.T) {
	dir := t.TempDir()
	n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOff})
	_, err := storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: dir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOff, Names: testNames(t)})
	if !store.HasCode(err, store.CodeBusy) {
		t.Fatalf("second boot on %s: %v, want %s", dir, err, store.CodeBusy)
	}
	// The first node is unharmed by the refusal.
	if err := n.Store.RequireQuorum(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Close releases the data dir; its single box's store cannot become a
	// cluster node's store in place.
	n.Close()
	_, err = storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: dir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOff,
		ClusterListen: "127.0.0.1:0", Names: testNames(t)})
	if !errors.Is(err, storagenode.ErrSingleBoxStore) {
		t.Fatalf("clustered boot on a single box's store: %v", err)
	}
	// And it boots alone again.
	boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOff})
}

func TestBootRefusesAnExposedStoreWithoutCredentials(t *testing.T) {
	_, err := storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: "0.0.0.0:0", Auth: storagenode.AuthOff, Names: testNames(t)})
	if !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "without credentials") {
		t.Fatalf("auth off on 0.0.0.0: %v", err)
	}
	_, err = storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: t.TempDir(), Auth: "maybe", Names: testNames(t)})
	if !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("auth mode maybe: %v", err)
	}
}

// A process that runs no storage node attaches to one: as a client that
// binds to the store, or provisioning it.
func TestAttach(t *testing.T) {
	n := boot(t, storagenode.BootConfig{DataDir: t.TempDir(), Auth: storagenode.AuthOn})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, provision := range []bool{false, true} {
		var out bytes.Buffer
		a, err := storagenode.Attach(ctx, storagenode.AttachConfig{URL: n.Server.ClientURL(), CredsFile: n.CredsFile, Names: testNames(t),
			Provision: provision, Progress: &out})
		if err != nil {
			t.Fatalf("attach (provision %v): %v", provision, err)
		}
		want := "not a storage node: client of " + n.Server.ClientURL() + ", hosting no replicated state\n"
		if provision {
			want = "provisioned streams and buckets for installation local, authority default (replicas 1)\n"
		}
		if out.String() != want || a.Server != nil || a.Store == nil {
			t.Fatalf("attach (provision %v): progress %q, server %v", provision, out.String(), a.Server)
		}
		if err := a.Store.RequireQuorum(ctx); err != nil {
			t.Fatal(err)
		}
		a.Close()
		if !a.Conn.IsClosed() {
			t.Fatal("Close left the connection open")
		}
	}
}

func TestAuthMode(t *testing.T) {
	for _, tc := range []struct {
		flag      string
		listeners []string
		want      bool
	}{
		{"auto", []string{"127.0.0.1:4222", ""}, false},
		{"", []string{"127.0.0.1:4222"}, false},
		{"auto", []string{"localhost:4222", "127.0.0.1:6222"}, false},
		{"auto", []string{"[::1]:4222"}, false},
		{"auto", []string{"0.0.0.0:4222"}, true},
		{"auto", []string{":4222"}, true},
		{"auto", []string{"10.0.0.1:4222"}, true},
		{"auto", []string{"127.0.0.1:4222", "10.0.0.1:6222"}, true},
		{"auto", []string{"[2001:db8::1]:4222"}, true},
		{"auto", []string{"box.example.com:4222"}, true},
		{"on", []string{"127.0.0.1:4222"}, true},
		{"true", []string{"127.0.0.1:4222"}, true},
		{"off", []string{"0.0.0.0:4222"}, false},
		{"false", []string{"0.0.0.0:4222"}, false},
	} {
		m, err := storagenode.ParseAuthMode(tc.flag)
		if err != nil {
			t.Fatalf("%q: %v", tc.flag, err)
		}
		if got := m.Required(tc.listeners...); got != tc.want {
			t.Errorf("--auth %q with listeners %q: required %v, want %v", tc.flag, tc.listeners, got, tc.want)
		}
	}
	if _, err := storagenode.ParseAuthMode("yes"); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("--auth yes: %v", err)
	}
}

// Three storage nodes booted at once form a cluster with credentials: one
// provisions the store at three replicas, the others bind to it.
func TestBootThreeStorageNodes(t *testing.T) {
	ports := freePorts(t, 3)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", p))
	}
	authDir := filepath.Join(t.TempDir(), "auth")
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	// The nodes run until the test ends; StartTimeout bounds the boot.
	ctx := t.Context()
	nodes := make([]*storagenode.Node, 3)
	outs := make([]bytes.Buffer, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = storagenode.Boot(ctx, storagenode.BootConfig{
				DataDir: t.TempDir(), Listen: "127.0.0.1:0", Name: fmt.Sprintf("s%d", i+1), Auth: storagenode.AuthOn, AuthDir: authDir,
				ClusterName: "edge", ClusterListen: routes[i], Routes: routes, Names: testNames(t), Progress: &outs[i],
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("s%d: %v\n%s", i+1, err, outs[i].String())
		}
		t.Cleanup(nodes[i].Close)
	}
	for i, n := range nodes {
		out := outs[i].String()
		if n.Auth == nil || n.Auth.ClusterSecret != nodes[0].Auth.ClusterSecret {
			t.Errorf("s%d: not on the shared auth dir's keys", i+1)
		}
		if want := fmt.Sprintf("storage node s%d of cluster edge: routes on %s, seeds %s\n", i+1, routes[i], strings.Join(routes, ",")); !strings.Contains(out, want) {
			t.Errorf("s%d progress:\n%s\nwant:\n%s", i+1, out, want)
		}
		if want := "provisioned streams and buckets for installation local, authority default (replicas 3)\n"; !strings.HasSuffix(out, want) {
			t.Errorf("s%d progress:\n%s\nwant last:\n%s", i+1, out, want)
		}
	}
	pl, err := nodes[0].Store.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pl {
		if p.Replicas != 3 {
			t.Fatalf("stream %s at %d replicas, want 3", p.Stream, p.Replicas)
		}
	}
	if a := statusAnswers(t, nodes[1]); len(a) != 3 {
		t.Fatalf("status answers: %+v", a)
	}
}

// A box whose free disk is less than the store's limits add up to (a small
// disk, or one nearly full) still starts a storage node: JetStream reserves
// each stream's limit whole, and without a limit of the node's own it
// refused the store's provisioning with storage_full.
func TestBootOnASmallDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	if store.ReservedBytes() <= 256<<20 {
		t.Fatalf("the store's limits add up to %d bytes: this test wants a disk smaller than them", store.ReservedBytes())
	}
	n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOff})
	if err := n.Store.PutMachine(context.Background(), &store.MachineRecord{ID: "m1", Address: "127.0.0.1", State: store.MachineActive}); err != nil {
		t.Fatalf("a write on the small disk: %v", err)
	}
}
