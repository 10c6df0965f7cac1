package storagenode_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Only the control role says through which revision the fleet status is
// current, and only it files a routing batch's parts: an agent's, a
// gateway's and meshd's real credentials are refused both, so a stolen
// box can neither make a reader believe a stale summary is current nor
// file a namespace's whole routing. The control role's publish lands.
func TestFleetFlushedAndBatchPartsAreTheControlRolesOnly(t *testing.T) {
	_, auth, ns := startWithAuth(t)
	names, _ := store.NewNames("", "")
	flushed, part := names.FleetStatusFlushedSubject(), names.RoutingBatchSubject("shop", 0)
	for _, r := range []storagenode.CredsRequest{
		{Role: storagenode.RoleAgent, Machine: "m1"},
		{Role: storagenode.RoleGateway, Machine: "gw1"},
		{Role: storagenode.RoleMesh, Machine: "m1"},
	} {
		nc, violations := roleConn(t, ns, auth, r)
		_ = nc.Publish(flushed, []byte(`{"revision":999999}`))
		refusedPublish(t, violations, "publish the fleet status's flushed notice as "+r.Role, flushed)
		_ = nc.Publish(part, []byte(`{"batch":"forged","namespace":"shop","parts":1}`))
		refusedPublish(t, violations, "file a routing batch part as "+r.Role, part)
	}
	ctl, violations := roleConn(t, ns, auth, storagenode.CredsRequest{Role: storagenode.RoleControl})
	heard := make(chan *nats.Msg, 1)
	if _, err := ctl.ChanSubscribe(flushed, heard); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Publish(flushed, []byte(`{"revision":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heard:
	case v := <-violations:
		t.Fatalf("the control role was refused: %v", v)
	case <-time.After(5 * time.Second):
		t.Fatal("the control role's flushed notice never arrived")
	}
}
