package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// `control creds revoke` on one storage node: every storage node closes the
// user's connection and refuses its credentials from then on; other
// credentials keep working.
func TestRevokeCredentialsAcrossTheCluster(t *testing.T) {
	sc := newStorageCluster(t)
	agentCreds := sc.issue(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"})
	gwCreds := sc.issue(storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw1"})
	connect := func(i int, creds string) error {
		nc, err := store.Connect(store.ConnectOptions{URL: sc.url(i), CredsFile: creds, Timeout: 2 * time.Second})
		if err == nil {
			nc.Close()
		}
		return err
	}
	for i := 1; i <= 3; i++ {
		if err := connect(i, agentCreds); err != nil {
			t.Fatalf("agent credentials on s%d before the revocation: %v", i, err)
		}
	}
	// A live connection on s3, to see it closed.
	closed := make(chan error, 1)
	live, err := store.Connect(store.ConnectOptions{URL: sc.url(3), CredsFile: agentCreds, OnDisconnect: func(err error) {
		select {
		case closed <- err:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	if _, e, code := sc.control(1, "creds", "revoke", "--user-creds", agentCreds, "--user", "UABC"); code == 0 || !strings.Contains(e, "exactly one of") {
		t.Fatalf("revoke with both a file and a key: %d %s", code, e)
	}
	out, e, code := sc.control(1, "creds", "revoke", "--user-creds", agentCreds, "--reason", "box m1 decommissioned")
	if code != 0 || !strings.Contains(out, "revoked agent-m1") {
		t.Fatalf("creds revoke: %d\n%s\n%s", code, out, e)
	}
	select {
	case err := <-closed:
		t.Logf("the revoked agent's connection to s3 was closed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the revoked agent's connection to s3 stayed open")
	}
	for i := 1; i <= 3; i++ {
		eventually(t, 10*time.Second, fmt.Sprintf("s%d to refuse the revoked credentials", i), func() bool {
			return connect(i, agentCreds) != nil
		})
		if err := connect(i, gwCreds); err != nil {
			t.Fatalf("gateway credentials on s%d after another user's revocation: %v", i, err)
		}
	}
}
