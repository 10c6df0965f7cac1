// Package storetest starts a real embedded nats-server with JetStream on
// 127.0.0.1 for tests, with its store in the test's temp dir, and provisions
// the edgeplane layout on it.
package storetest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Server is a running test server and a provisioned store on it.
type Server struct {
	NATS  *server.Server
	URL   string
	Dir   string
	Store *store.Store
}

// AuthDir holds the server's trust root (signing.RootFile), as a storage
// node's auth dir does; it lives in Dir, so a restart in Dir keeps it.
func (s *Server) AuthDir() string { return filepath.Join(s.Dir, "auth") }

// SignerFile is the signer the stores Connect returns sign with, as a
// control server's DATA/signer.nk.
func (s *Server) SignerFile() string { return filepath.Join(s.Dir, signers.SignerFile) }

// Start starts a server on a random loopback port and provisions the default
// names. Everything stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartIn(t, t.TempDir(), "127.0.0.1:0")
}

// SyncEnv, if set, is the sync policy (`control server --sync`: always or
// an interval) of the servers Start starts, so that one test binary
// measures what the policy costs a benchmark, run under each in turn.
// Unset, they have the storage node's default.
const SyncEnv = "EDGEPLANE_STORETEST_SYNC"

// StartIn starts a server with its store in dir, listening on listen (use a
// fixed port to restart a server at the same address).
func StartIn(t testing.TB, dir, listen string) *Server {
	t.Helper()
	sync, err := storagenode.ParseSync(os.Getenv(SyncEnv))
	if err != nil {
		t.Fatalf("%s: %v", SyncEnv, err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: listen, SyncInterval: sync})
	if err != nil {
		t.Fatalf("starting nats: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	s := &Server{NATS: ns, URL: ns.ClientURL(), Dir: dir}
	s.Store = s.Connect(t)
	return s
}

// Connect opens another connection and provisioned store on the server, as
// another control server would: it signs with SignerFile and verifies under
// the trust root in AuthDir.
func (s *Server) Connect(t testing.TB) *store.Store {
	t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: s.URL, Name: t.Name()})
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names, _ := store.NewNames("", "")
	st, err := store.Provision(ctx, nc, names, store.Layout{})
	if err != nil {
		t.Fatalf("provisioning: %v", err)
	}
	if _, err := signers.Server(ctx, st, s.AuthDir(), s.Dir, "storetest"); err != nil {
		t.Fatalf("signing keys: %v", err)
	}
	return st
}

// Conn opens a bare connection.
func (s *Server) Conn(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: s.URL, Name: t.Name()})
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// FreeAddr reserves a loopback address for a server that must start, or
// restart, at a known address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		// The kernel readily hands the port just closed out again: two
		// calls in a row (a gateway's HTTP and admin addresses) could
		// get the same one.
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
	t.Fatal("no loopback port that was not handed out already")
	return ""
}

// handedOut are the addresses FreeAddr returned in this process.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// Eventually polls cond every 10ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ShareTrustRoot puts from's trust root in dir's auth dir, as a storage
// node started in dir with a copy of from's auth dir would have.
func ShareTrustRoot(t testing.TB, from *Server, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(from.AuthDir(), signing.RootFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "auth"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "auth", signing.RootFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
