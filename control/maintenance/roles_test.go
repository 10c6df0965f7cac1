package maintenance_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// An agent's and a gateway's real credentials cannot put a namespace
// under maintenance, even holding the control plane's own signer key: the
// storage node refuses the publish (a permissions violation on the
// maintenance subject) and no record is stored. The control role's can.
func TestOnlyTheControlRolePublishesMaintenance(t *testing.T) {
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	node, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { node.Shutdown(); node.WaitForShutdown() }()
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	connect := func(r storagenode.CredsRequest, violations chan error) *nats.Conn {
		t.Helper()
		b, err := auth.IssueCreds(r)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), r.Role+r.Machine+".creds")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		nc, err := store.Connect(store.ConnectOptions{URL: node.ClientURL(), CredsFile: p})
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
	cs, err := store.Provision(ctx, connect(storagenode.CredsRequest{Role: storagenode.RoleControl}, nil), names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Server(ctx, cs, filepath.Join(dir, "auth"), dir, "test"); err != nil {
		t.Fatal(err)
	}
	key, err := signing.OpenKeyFile(filepath.Join(dir, signers.SignerFile))
	if err != nil {
		t.Fatal(err)
	}
	cs.SignWith(key)
	if _, err := cs.AppendCommit(ctx, &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {Command: []string{"true"}}}}}); err != nil {
		t.Fatal(err)
	}
	subject := cs.Names.RoutingMaintenanceSubject("shop", "")
	for _, r := range []storagenode.CredsRequest{{Role: storagenode.RoleAgent, Machine: "m1"}, {Role: storagenode.RoleGateway, Machine: "gw0"}} {
		violations := make(chan error, 16)
		xs, err := store.Open(ctx, connect(r, violations), names)
		if err != nil {
			t.Fatalf("%s binds the store: %v", r.Role, err)
		}
		xs.SignWith(key)
		c, stop := context.WithTimeout(ctx, 5*time.Second)
		done := make(chan error, 1)
		go func() {
			_, err := xs.SetMaintenance(c, store.MaintenanceRecord{Namespace: "shop", On: true, Message: "pwned", By: "mallory"})
			done <- err
		}()
		refused := false
		for !refused {
			select {
			case v := <-violations:
				refused = strings.Contains(v.Error(), "Permissions Violation") && strings.Contains(v.Error(), subject)
			case err := <-done:
				stop()
				t.Fatalf("%s's credentials: publishing maintenance ended with %v, not a permissions violation on %s", r.Role, err, subject)
			}
		}
		stop()
		<-done
		if recs, err := cs.MaintenanceRecords(ctx); err != nil || len(recs) != 0 {
			t.Fatalf("after %s's attempt: region records %v %v", r.Role, recs, err)
		}
	}
	ch, err := maintenance.Set(ctx, cs, maintenance.Request{Namespace: "shop", On: true})
	if err != nil || !ch.Changed || ch.Seq == 0 {
		t.Fatalf("the control role: %+v %v", ch, err)
	}
	if recs, err := cs.MaintenanceRecords(ctx); err != nil || len(recs) != 1 || !recs[0].On {
		t.Fatalf("after the control role's: %v %v", recs, err)
	}
}
