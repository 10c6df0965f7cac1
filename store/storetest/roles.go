package storetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// RolesNode is a storage node that requires credentials, for tests that
// try what a role must not do with that role's real credentials, and a
// store provisioned on it by the control role, signing as a control
// server does.
type RolesNode struct {
	NATS *server.Server
	Auth *storagenode.Auth
	// Control is the control role's store; it signs with Key.
	Control *store.Store
	Key     *signing.KeyFile
	Names   store.Names
}

// StartRoles starts a RolesNode in a temp dir, stopped when t ends.
func StartRoles(t testing.TB, ctx context.Context) *RolesNode {
	t.Helper()
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	n := &RolesNode{NATS: ns, Auth: auth}
	n.Names, _ = store.NewNames("", "")
	n.Control, err = store.Provision(ctx, n.Connect(t, storagenode.CredsRequest{Role: storagenode.RoleControl}, nil), n.Names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Server(ctx, n.Control, filepath.Join(dir, "auth"), dir, "test"); err != nil {
		t.Fatal(err)
	}
	if n.Key, err = signing.OpenKeyFile(filepath.Join(dir, signers.SignerFile)); err != nil {
		t.Fatal(err)
	}
	n.Control.SignWith(n.Key)
	return n
}

// Connect connects with freshly issued credentials of r, closed when t
// ends. With violations, the connection's asynchronous errors (a
// permissions violation) are sent there, dropped when it is full.
func (n *RolesNode) Connect(t testing.TB, r storagenode.CredsRequest, violations chan<- error) *nats.Conn {
	t.Helper()
	b, err := n.Auth.IssueCreds(r)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), r.Role+r.Machine+".creds")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: n.NATS.ClientURL(), CredsFile: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if violations != nil {
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		})
	}
	return nc
}

// Open binds the store with r's credentials, as that role's process does.
func (n *RolesNode) Open(t testing.TB, ctx context.Context, r storagenode.CredsRequest, violations chan<- error) *store.Store {
	t.Helper()
	s, err := store.Open(ctx, n.Connect(t, r, violations), n.Names)
	if err != nil {
		t.Fatalf("%s binds the store: %v", r.Role, err)
	}
	return s
}

// TryAs tries publish with r's credentials, on a store that signs with
// the control plane's own key (what a stolen box could hold at worst),
// and fails t unless the storage node refuses it: a permissions violation
// naming subject, before publish returns.
func (n *RolesNode) TryAs(t testing.TB, ctx context.Context, r storagenode.CredsRequest, subject string, publish func(ctx context.Context, s *store.Store) error) {
	t.Helper()
	violations := make(chan error, 16)
	s := n.Open(t, ctx, r, violations)
	s.SignWith(n.Key)
	c, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- publish(c, s) }()
	for {
		select {
		case v := <-violations:
			if strings.Contains(v.Error(), "Permissions Violation") && strings.Contains(v.Error(), subject) {
				stop()
				<-done
				return
			}
		case err := <-done:
			t.Fatalf("%s's credentials: the publish ended with %v, not a permissions violation on %s", r.Role, err, subject)
		}
	}
}
