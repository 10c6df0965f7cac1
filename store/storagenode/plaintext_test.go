package storagenode_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/internal/netnstest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// withoutCA is a credentials file as it was before credentials carried
// the fleet CA: the JWT and the seed alone.
func withoutCA(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(b, []byte("-----BEGIN CERTIFICATE-----")); i >= 0 {
		b = b[:i]
	}
	p := filepath.Join(t.TempDir(), "old.creds")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Credentials never travel in plaintext to another box: a client holding
// real credentials without the fleet CA refuses a nats:// server on an
// address that is not loopback (a structured error naming the fix) before
// it sends a byte, while the same server takes a connection that carries
// no secret, and loopback stays allowed.
func TestCredentialsRefusePlaintextToAnotherBox(t *testing.T) {
	addr := netnstest.NonLoopbackAddr(t, "eppt", 231)
	auth, err := storagenode.LoadAuth(filepath.Join(t.TempDir(), "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	creds := withoutCA(t, writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleControl}))

	// A plaintext NATS server on that address: a node set up by mistake,
	// or someone's on the path.
	ns, err := server.NewServer(&server.Options{Host: addr, Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	url := ns.ClientURL()
	if !strings.Contains(url, addr) {
		t.Fatalf("server URL %s is not on %s", url, addr)
	}
	// It is reachable: a connection without a secret gets through.
	nc, err := store.Connect(store.ConnectOptions{URL: url})
	if err != nil {
		t.Fatalf("a connection without credentials: %v", err)
	}
	nc.Close()
	storetest.Eventually(t, 5*time.Second, "the server to drop the closed client", func() bool { return ns.NumClients() == 0 })
	total := func() uint64 { v, _ := ns.Varz(nil); return v.TotalConnections }
	seen := total()

	for name, o := range map[string]store.ConnectOptions{
		"credentials":                    {URL: url, CredsFile: creds},
		"credentials, host:port":         {URL: strings.TrimPrefix(url, "nats://"), CredsFile: creds},
		"credentials, one of a list":     {URL: "nats://127.0.0.1:4222," + url, CredsFile: creds},
		"a password in the URL":          {URL: strings.Replace(url, "nats://", "nats://u:secret@", 1)},
		"credentials, reconnect forever": {URL: url, CredsFile: creds, ReconnectForever: true},
	} {
		_, err := store.Connect(o)
		if !store.HasCode(err, store.CodePlaintextRefused) {
			t.Fatalf("%s: want %s, got %v", name, store.CodePlaintextRefused, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "--tls-ca") || strings.Contains(msg, "secret") {
			t.Errorf("%s: the error does not say what to do, or shows the password: %s", name, msg)
		}
	}
	if got := total(); got != seen || ns.NumClients() != 0 {
		t.Errorf("a refused client reached the server: %d connections, %d before", got, seen)
	}

	// A storage node told to speak plaintext off loopback (--tls off)
	// still boots: its own connection to itself never leaves the box. Its
	// control credentials, taken elsewhere, are refused like any other.
	node, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: addr + ":0", Auth: storagenode.AuthOn,
		TLS: storagenode.ToggleOff, Encrypt: storagenode.ToggleOff})
	if err != nil {
		t.Fatalf("a plaintext node off loopback: %v", err)
	}
	defer node.Close()
	if _, err := store.Connect(store.ConnectOptions{URL: node.Server.ClientURL(), CredsFile: node.CredsFile}); !store.HasCode(err, store.CodePlaintextRefused) {
		t.Fatalf("its control credentials from another client: %v", err)
	}

	// On loopback, the same credentials connect in plaintext, as the
	// single-box default does.
	local, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go local.Start()
	t.Cleanup(func() { local.Shutdown(); local.WaitForShutdown() })
	if !local.ReadyForConnections(10 * time.Second) {
		t.Fatal("the loopback server did not start")
	}
	lc, err := store.Connect(store.ConnectOptions{URL: local.ClientURL(), CredsFile: creds})
	if err != nil {
		t.Fatalf("credentials on loopback: %v", err)
	}
	lc.Close()
}
