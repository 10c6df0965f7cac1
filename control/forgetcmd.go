package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// storageForget takes a stopped storage node out of the JetStream meta
// group, after `storage remove` took its replicas away. A node left there
// still counts toward the meta group's size: with it, adding a replacement
// makes four members and a quorum of three. NATS reserves the operation to
// the system account, whose keys are in a storage node's auth dir.
func storageForget(ctx context.Context, s *store.Store, url, authDir string, v *storageView, id string, wait time.Duration, out *output) error {
	member := false
	for _, n := range v.Nodes {
		if n.Name != id {
			continue
		}
		member = true
		if n.Answered {
			return store.Errorf(store.CodeConflict, "storage node %s still answers: `control storage remove %s` it, then stop its `control server`, then forget it", id, id).
				With("node", id)
		}
		if n.Replicas > 0 {
			return store.Errorf(store.CodeConflict, "storage node %s still holds %d replicas: `control storage remove %s` first (it moves them while writes go on)", id, n.Replicas, id).
				With("node", id)
		}
	}
	if !member {
		return store.Errorf(store.CodeNotFound, "no storage node %s in the JetStream meta group", id).With("node", id)
	}
	a, err := storagenode.LoadAuth(authDir, false)
	if err != nil {
		return err
	}
	file, remove, err := issueTempCreds(a, storagenode.CredsRequest{Role: storagenode.RoleControl, System: true, Name: "storage-forget", Names: s.Names, TTL: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer remove()
	sys, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: file, Name: "control storage forget"})
	if err != nil {
		return err
	}
	defer sys.Close()
	req, _ := json.Marshal(server.JSApiMetaServerRemoveRequest{Server: id})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := sys.RequestWithContext(rctx, server.JSApiRemoveServer, req)
	if err != nil {
		return store.Classify(fmt.Errorf("asking the meta leader to remove %s: %w", id, err))
	}
	var resp server.JSApiMetaServerRemoveResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("undecodable answer to the removal of %s: %w", id, err)
	}
	if resp.Error != nil {
		return store.Errorf(store.CodeConflict, "the meta leader refused to remove %s: %v", id, resp.Error).With("node", id)
	}
	// Done when every answering node has dropped it from its view.
	deadline := time.Now().Add(30 * time.Second)
	for {
		answers, err := store.GatherStorageStatus(ctx, s.NC, s.Names, wait)
		gone := err == nil && len(answers) > 0
		size := 0
		for _, a := range answers {
			size = max(size, a.ClusterSize)
			if slices.ContainsFunc(a.Peers, func(p store.StoragePeer) bool { return p.Name == id }) {
				gone = false
			}
		}
		if gone {
			return out.emit(map[string]any{"node": id, "forgotten": true, "meta_group_size": size}, func(w io.Writer) {
				fmt.Fprintf(w, "storage node %s left the JetStream meta group (now %d members); the name stays out of it: a replacement machine takes a new --name\n", id, size)
			})
		}
		if time.Now().After(deadline) {
			return store.Errorf(store.CodeUnavailable, "the meta leader accepted the removal of %s, but not every node has dropped it after 30s", id).With("node", id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
