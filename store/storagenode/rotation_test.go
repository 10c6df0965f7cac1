package storagenode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The steps go in order, each refusing to run out of turn, and each moves
// the generation forward.
func TestCARotationSteps(t *testing.T) {
	authDir := t.TempDir()
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	first, _ := storagenode.LoadFleetTLS(authDir)
	if _, err := storagenode.SwitchCA(authDir); !store.HasCode(err, store.CodeConflict) || !strings.Contains(err.Error(), "next step is begin") {
		t.Fatalf("switch before begin: %v", err)
	}
	begun, err := storagenode.BeginCARotation(authDir)
	if err != nil || len(begun.Bundle) != 2 || pki.Fingerprint(begun.CA.Cert) != pki.Fingerprint(first.CA.Cert) || begun.Generation != first.Generation+1 {
		t.Fatalf("begin: %+v %v", begun, err)
	}
	if _, err := storagenode.BeginCARotation(authDir); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("begin twice: %v", err)
	}
	switched, err := storagenode.SwitchCA(authDir)
	if err != nil || len(switched.Bundle) != 2 || pki.Fingerprint(switched.CA.Cert) != pki.Fingerprint(begun.Bundle[1]) {
		t.Fatalf("switch: %+v %v", switched, err)
	}
	done, err := storagenode.FinishCARotation(authDir)
	if err != nil || len(done.Bundle) != 1 || pki.Fingerprint(done.Bundle[0]) != pki.Fingerprint(switched.CA.Cert) || done.Generation != first.Generation+3 {
		t.Fatalf("finish: %+v %v", done, err)
	}
	if st, _ := storagenode.CARotationState(authDir); st != storagenode.RotationNone {
		t.Fatalf("state after finish: %s", st)
	}
}

// A CA rotation with its overlap: a long-running client follows the
// bundle the store holds and keeps connecting across every step and node
// restart; credentials from before it, never connected meanwhile, trust
// the old CA only and are refused once the node moved to the new one.
func TestCARotationKeepsFollowingClients(t *testing.T) {
	authDir, dataDir, listen := t.TempDir(), t.TempDir(), storetest.FreeAddr(t)
	var node *storagenode.Node
	boot := func() {
		t.Helper()
		n, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: dataDir, Listen: listen, Auth: storagenode.AuthOn, AuthDir: authDir})
		if err != nil {
			t.Fatal(err)
		}
		node = n
	}
	boot()
	t.Cleanup(func() { node.Close() })
	root, err := signing.LoadRoot(authDir)
	if err != nil {
		t.Fatal(err)
	}
	// The client's own credentials, and a copy nobody updates.
	dir := t.TempDir()
	creds, stale := filepath.Join(dir, "client.creds"), filepath.Join(dir, "stale.creds")
	b, _ := os.ReadFile(node.CredsFile)
	for _, f := range []string{creds, stale} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := store.Connect(store.ConnectOptions{URL: node.Server.ClientURL(), CredsFile: creds, ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	client, err := store.Open(context.Background(), nc, node.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	anchor, err := store.ResolveAnchor("", creds, "")
	if err != nil {
		t.Fatal(err)
	}
	client.TrustAnchor(anchor)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go store.FollowTLSBundle(ctx, client, creds, 50*time.Millisecond, func(err error) { t.Logf("following: %v", err) })

	step := func(name string, run func(string) (*storagenode.FleetTLS, error)) *storagenode.FleetTLS {
		t.Helper()
		f, err := run(authDir)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := node.Store.PublishTLSBundle(context.Background(), root, f.BundlePEM, f.Generation); err != nil {
			t.Fatalf("%s: publishing: %v", name, err)
		}
		storetest.Eventually(t, 15*time.Second, "the client to follow the bundle of "+name, func() bool {
			got, err := os.ReadFile(store.BundleFile(creds))
			certs, _ := pki.ParseCerts(got)
			return err == nil && len(certs) == len(f.Bundle) && pki.Fingerprint(certs[len(certs)-1]) == pki.Fingerprint(f.Bundle[len(f.Bundle)-1])
		})
		node.Close()
		boot()
		storetest.Eventually(t, 15*time.Second, "the client to reconnect after "+name, func() bool {
			return nc.Status() == nats.CONNECTED && nc.Flush() == nil
		})
		return f
	}
	step("begin", storagenode.BeginCARotation)
	switched := step("switch", storagenode.SwitchCA)
	if err := node.TLS.Leaf().CheckSignatureFrom(switched.CA.Cert); err != nil {
		t.Fatalf("after the switch the node is not on the new CA: %v", err)
	}
	if _, err := store.Connect(store.ConnectOptions{URL: node.Server.ClientURL(), CredsFile: stale, Timeout: 3 * time.Second}); !store.HasCode(err, store.CodeTLS) {
		t.Fatalf("credentials that never followed the rotation: %v", err)
	}
	step("finish", storagenode.FinishCARotation)
	// A restart of the client: its followed bundle outlives it.
	fresh, err := store.Connect(store.ConnectOptions{URL: node.Server.ClientURL(), CredsFile: creds})
	if err != nil {
		t.Fatalf("the client, started again, with the bundle it followed: %v", err)
	}
	fresh.Close()
}
