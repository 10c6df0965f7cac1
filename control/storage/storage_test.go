package storage

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A single box, as `control server` boots it, read as `control storage
// ls` reads it.
func TestReadOneBox(t *testing.T) {
	names, _ := store.NewNames("", "")
	n, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Names: names})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	v, err := Read(ctx, n.Store, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if v.Quorum != nil || len(v.Answers) != 1 || len(v.Placement) == 0 {
		t.Fatalf("view: %+v", v)
	}
	streams := len(v.Placement)
	want := []NodeView{{Name: "edgeplane", Answered: true, MetaLeader: true, Replicas: streams, Leads: streams}}
	if !slices.Equal(v.Nodes, want) {
		t.Fatalf("nodes %+v, want %+v", v.Nodes, want)
	}

	// The box is a current member at one replica: adding it changes
	// nothing, and removing it would leave no one.
	p, err := PlanAdd(v, "edgeplane", 5)
	if err != nil || p.Grows() {
		t.Fatalf("plan add: %+v, %v", p, err)
	}
	var out bytes.Buffer
	if pl, err := Add(ctx, n.Store, p, time.Minute, &out); err != nil || pl != nil || out.Len() > 0 {
		t.Fatalf("add without growth: %v, %v, %q", pl, err, out.String())
	}
	if _, err := PlanRemove(v, "edgeplane"); !store.HasCode(err, store.CodeQuorumUnavailable) {
		t.Fatalf("removing the only node: %v", err)
	}

	// Every stream is caught up at one replica; a condition that never
	// holds ends in a structured error naming what it waited for.
	if pl, err := waitCaughtUp(ctx, n.Store, 1, time.Second); err != nil || len(pl) != streams {
		t.Fatalf("caught up: %d streams, %v", len(pl), err)
	}
	_, err = waitPlacement(ctx, n.Store, 300*time.Millisecond, "the impossible", func(store.StreamPlacement) bool { return false })
	if se := store.AsError(err); se.Code != store.CodeUnavailable || !strings.HasPrefix(se.Message, "waiting for the impossible: not settled within 300ms: still waiting for ") {
		t.Fatalf("waiting for the impossible: %v", err)
	}
}

// A single box's store goes into a fresh cluster with its data and its
// signers; a second run finds it done.
func TestImportASingleBox(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	boxDir := t.TempDir()
	box := storetest.StartIn(t, boxDir, "127.0.0.1:0")
	code, _, err := invites.Create(ctx, box.Store, invites.Spec{Region: "eu", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	box.NATS.Shutdown()
	box.NATS.WaitForShutdown()

	cluster := storetest.Start(t)
	root, err := signers.RootFrom(cluster.AuthDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep, err := Import(ctx, cluster.Store, ImportConfig{From: boxDir, Root: root, Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Imported) == 0 || len(rep.Signers) == 0 || len(rep.Already) != 0 || rep.From != boxDir {
		t.Fatalf("report: %+v", rep)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(rep.Imported) || !strings.HasPrefix(lines[0], "imported "+rep.Imported[0].Stream+": ") {
		t.Fatalf("progress:\n%s", out.String())
	}

	// Again: nothing left to copy.
	again, err := Import(ctx, cluster.Store, ImportConfig{From: boxDir, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	var imported []string
	for _, imp := range rep.Imported {
		imported = append(imported, imp.Stream)
	}
	if len(again.Imported) != 0 || !slices.Equal(again.Already, imported) {
		t.Fatalf("second run: %+v, want %v already imported", again, imported)
	}

	// The box's data is the cluster's: its invite is redeemable there.
	if _, err := invites.Redeem(ctx, cluster.Store, code, "m1", store.InviteUseAdmit); err != nil {
		t.Fatalf("the box's invite in the cluster: %v", err)
	}
	// Now the cluster has data of its own, and the import refuses.
	_, err = Import(ctx, cluster.Store, ImportConfig{From: boxDir, Root: root})
	if se := store.AsError(err); se.Code != store.CodeConflict || !strings.Contains(se.Message, "KV_"+cluster.Store.Names.InvitesBucket()+" (1 messages)") {
		t.Fatalf("import into a cluster with data of its own: %v", err)
	}

	// Not a store at all.
	if _, err := Import(ctx, cluster.Store, ImportConfig{From: filepath.Join(t.TempDir(), "none"), Root: root}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("import from an empty dir: %v", err)
	}
}
