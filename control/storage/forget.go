package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// ForgetConfig is what Forget needs beyond the store.
type ForgetConfig struct {
	// URL of the storage nodes, for the system account's connection.
	URL string
	// AuthDir is a storage node's auth dir: NATS reserves taking a server
	// out of the meta group to the system account, whose keys are there.
	AuthDir string
	// Wait is how long storage nodes have to answer each status request.
	Wait time.Duration
}

// forgetSettle bounds the wait for every node to drop a forgotten one.
const forgetSettle = 30 * time.Second

// Forget takes a stopped storage node out of the JetStream meta group,
// after Remove took its replicas away; v is the view CheckForget judges.
// A node left there still counts toward the meta group's size: with it,
// adding a replacement makes four members and a quorum of three. Forget
// returns once every answering node has dropped it, with the meta group's
// size then.
func Forget(ctx context.Context, s *store.Store, v *View, node string, cfg ForgetConfig) (metaGroupSize int, err error) {
	if err := CheckForget(v, node); err != nil {
		return 0, err
	}
	a, err := storagenode.LoadAuth(cfg.AuthDir, false)
	if err != nil {
		return 0, err
	}
	file, remove, err := a.TempCredsFile(storagenode.CredsRequest{Role: storagenode.RoleControl, System: true, Name: "storage-forget", Names: s.Names, TTL: 10 * time.Minute})
	if err != nil {
		return 0, err
	}
	defer remove()
	sys, err := store.Connect(store.ConnectOptions{URL: cfg.URL, CredsFile: file, Name: "control storage forget"})
	if err != nil {
		return 0, err
	}
	defer sys.Close()
	req, _ := json.Marshal(server.JSApiMetaServerRemoveRequest{Server: node})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := sys.RequestWithContext(rctx, server.JSApiRemoveServer, req)
	if err != nil {
		return 0, store.Classify(fmt.Errorf("asking the meta leader to remove %s: %w", node, err))
	}
	var resp server.JSApiMetaServerRemoveResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, fmt.Errorf("undecodable answer to the removal of %s: %w", node, err)
	}
	if resp.Error != nil {
		return 0, store.Errorf(store.CodeConflict, "the meta leader refused to remove %s: %v", node, resp.Error).With("node", node)
	}
	// Done when every answering node has dropped it from its view.
	deadline := time.Now().Add(forgetSettle)
	for {
		answers, err := store.GatherStorageStatus(ctx, s.NC, s.Names, cfg.Wait)
		gone := err == nil && len(answers) > 0
		size := 0
		for _, a := range answers {
			size = max(size, a.ClusterSize)
			if slices.ContainsFunc(a.Peers, func(p store.StoragePeer) bool { return p.Name == node }) {
				gone = false
			}
		}
		if gone {
			return size, nil
		}
		if time.Now().After(deadline) {
			return 0, store.Errorf(store.CodeUnavailable, "the meta leader accepted the removal of %s, but not every node has dropped it after %s", node, forgetSettle).With("node", node)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
