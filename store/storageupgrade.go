package store

import (
	"context"

	"github.com/nats-io/nats.go"
)

// CmdStorageUpgrade is the order that moves a storage node's `control
// server` to another release (StorageNodeSubject). It is signed as an
// agent's orders are: control credentials alone, which may publish
// anywhere, do not make a storage node run another binary.
const CmdStorageUpgrade = "upgrade"

// StorageNodeSubject addresses command on the `control server` of storage
// node node. It lies outside what the edge account imports (agents,
// gateways and meshd reach only storage.status), so only control
// credentials can publish on it at all.
func (n Names) StorageNodeSubject(node, command string) string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".storage.node." + node + "." + command
}

// StorageNodeMarker is the token pair before a command in
// StorageNodeSubject, for Serve.
func StorageNodeMarker(node string) string { return "node." + node }

// storageOrderMachine is what a storage node's order names as its machine:
// its own namespace, so that an order signed for storage node s1 cannot
// pass for an order to an agent whose machine is called s1 (a box running
// `control server --agent` is both).
func storageOrderMachine(node string) string { return "storage:" + node }

// OrderStorageNode sends req to storage node node's `control server` as an
// order signed by s's signer, and decodes its reply. It asks once: an order
// is good once, so asking again could only be refused as replayed.
func (s *Store) OrderStorageNode(ctx context.Context, node string, req UpgradeRequest, rep *UpgradeReply) error {
	data, h, err := s.signOrder(storageOrderMachine(node), CmdStorageUpgrade, req)
	if err != nil {
		return err
	}
	return call(ctx, s.NC, &nats.Msg{Subject: s.Names.StorageNodeSubject(node, CmdStorageUpgrade), Header: h, Data: data}, node, CmdStorageUpgrade, rep, "")
}

// VerifyStorageOrder is VerifyOrder for an order received by storage node
// node: signed by a certified, active signer for this node and command,
// fresh, and not seen before by book.
func (s *Store) VerifyStorageOrder(ctx context.Context, node, command string, header nats.Header, data []byte, book *OrderBook) (*Order, error) {
	_, o, err := s.VerifyOrder(ctx, storageOrderMachine(node), command, header, data, book)
	return o, err
}
