package store

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
)

// A request dropped with its connection, as when the storage node a client
// is connected to restarts (control storage upgrade), is ridden out like a
// leader election: the client is on another node moments later.
func TestARestartingNodeIsRiddenOut(t *testing.T) {
	for _, err := range []error{nats.ErrDisconnected, nats.ErrConnectionReconnecting, fmt.Errorf("publishing: %w", nats.ErrDisconnected)} {
		if !electionSymptom(err) {
			t.Errorf("%v is not ridden out", err)
		}
	}
	if electionSymptom(nats.ErrConnectionClosed) {
		t.Error("a closed connection is ridden out: it never comes back")
	}
}

// A storage node's order subject lies outside the edge account's import of
// storage.status, and an order for storage node s1 is not one for an agent
// whose machine is called s1.
func TestStorageNodeSubject(t *testing.T) {
	n, _ := NewNames("", "")
	if got := n.StorageNodeSubject("s1", CmdStorageUpgrade); got != "edgeplane.v1.local.default.storage.node.s1.upgrade" {
		t.Fatalf("subject %s", got)
	}
	if storageOrderMachine("s1") == "s1" || n.orderMessage(storageOrderMachine("s1"), CmdStorageUpgrade, nil).Subject == n.RPCSubject("s1", CmdUpgrade) {
		t.Fatal("a storage order signs what an agent order for the same name signs")
	}
}
