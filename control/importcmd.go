package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/signing/signers"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// importView is `control storage import`'s answer.
type importView struct {
	From     string                     `json:"from"`
	Imported []storagenode.StreamImport `json:"imported"`
	// Already holds streams a previous run imported (same messages and
	// sequences on both sides), left as they are.
	Already []string `json:"already_imported,omitempty"`
	// Skipped holds live observations (gateway progress, heartbeats, drift
	// reports): their writers rebuild them, so they are not carried over.
	Skipped []string `json:"skipped,omitempty"`
	// Signers are the box's signing keys, certified under the cluster's
	// trust root and retired at the box's last sequences: what they signed
	// on the box verifies in the cluster, nothing they sign later does.
	Signers []string `json:"signers_adopted,omitempty"`
}

// storageImport copies a stopped single box's store (its data dir) into the
// cluster s is connected to, stream by stream with JetStream's snapshot and
// restore: every commit, record, certificate and sequence as it was. It
// refuses before changing anything when a cluster stream already holds data
// of its own, and reading the box's store changes nothing there.
func storageImport(ctx context.Context, s *store.Store, root *signing.Key, from, fromAuthDir string, out *output) error {
	layout, err := storagenode.ReadStoreLayout(from)
	if err != nil {
		return err
	}
	switch {
	case layout.Clustered:
		return store.Errorf(store.CodeInvalid, "%s is a storage node's store of a cluster, not a single box's", from).With("from", from)
	case len(layout.Accounts) == 0:
		return store.Errorf(store.CodeNotFound, "%s holds no JetStream store (want the single box's --data dir)", from).With("from", from)
	case len(layout.Accounts) > 1:
		return store.Errorf(store.CodeInvalid, "%s holds streams of %d accounts (%s); edgeplane writes one", from, len(layout.Accounts), strings.Join(layout.Accounts, ", ")).With("from", from)
	}
	release, err := storagenode.LockDataDir(from)
	if err != nil {
		return err
	}
	defer release()

	// Serve the box's store read-only in spirit: a private server on a
	// random loopback port, with the box's own keys when it had them.
	cfg := storagenode.Config{DataDir: from, Listen: "127.0.0.1:0", ServerName: "edgeplane-import"}
	var creds string
	boxAuthDir := fromAuthDir
	if boxAuthDir == "" {
		boxAuthDir = filepath.Join(from, "auth")
	}
	if acct := layout.Accounts[0]; acct != "$G" {
		dir := boxAuthDir
		a, err := storagenode.LoadAuth(dir, false)
		if err != nil {
			return fmt.Errorf("the single box required credentials: %w", err)
		}
		if a.AccountPublicKey() != acct {
			return store.Errorf(store.CodeInvalid, "auth dir %s is for account %s, the store holds account %s", dir, a.AccountPublicKey(), acct).
				With("auth_dir", dir)
		}
		cfg.Auth = a
		file, remove, err := issueTempCreds(a, storagenode.CredsRequest{Role: storagenode.RoleControl, Names: s.Names, Name: "storage-import", TTL: time.Hour})
		if err != nil {
			return err
		}
		defer remove()
		creds = file
	}
	ns, err := storagenode.Start(cfg)
	if err != nil {
		return fmt.Errorf("opening %s: %w", from, err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	src, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: creds, Name: "control storage import"})
	if err != nil {
		return err
	}
	defer src.Close()
	srcJS, err := jetstream.New(src)
	if err != nil {
		return err
	}
	if err := store.WaitForJetStream(ctx, src); err != nil {
		return err
	}

	observation := map[string]bool{}
	for _, b := range s.Names.ObservationBuckets() {
		observation["KV_"+b] = true
	}
	// Leases are live coordination, not data: their holders (the box's
	// processes, the cluster's control servers, which take the fleet
	// status lease as they start) take them again.
	observation["KV_"+s.Names.LocksBucket()] = true
	// The cluster keeps its own trust root and signers; the box's are
	// carried over by certificate (signers.Adopt), not copied.
	signersStream := "KV_" + s.Names.SignersBucket()
	type plan struct {
		stream   string
		replicas int
	}
	var todo []plan
	var conflicts []string
	view := &importView{From: from}
	for _, name := range s.StreamNames() {
		old, err := srcJS.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // an older box without this stream: nothing to carry
		}
		if err != nil {
			return fmt.Errorf("reading %s in %s: %w", name, from, err)
		}
		if observation[name] {
			view.Skipped = append(view.Skipped, name)
			continue
		}
		if name == signersStream {
			continue
		}
		oldState := old.CachedInfo().State
		if oldState.LastSeq == 0 {
			continue // never written: the cluster's empty stream is the same
		}
		cur, err := s.JS.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return store.Errorf(store.CodeNotFound, "the cluster has no stream %s: start the storage nodes' `control server` first (it creates them)", name).
				With("stream", name)
		}
		if err != nil {
			return store.Classify(fmt.Errorf("reading %s in the cluster: %w", name, err))
		}
		ci := cur.CachedInfo()
		st := ci.State
		switch {
		case st.Msgs == oldState.Msgs && st.FirstSeq == oldState.FirstSeq && st.LastSeq == oldState.LastSeq:
			view.Already = append(view.Already, name)
		case st.Msgs == 0 && st.LastSeq == 0:
			todo = append(todo, plan{stream: name, replicas: ci.Config.Replicas})
		default:
			conflicts = append(conflicts, fmt.Sprintf("%s (%d messages)", name, st.Msgs))
		}
	}
	if len(conflicts) > 0 {
		return store.Errorf(store.CodeConflict, "the cluster already holds data of its own in %s; import into a fresh cluster, before agents, gateways or deploys use it. Nothing was changed",
			strings.Join(conflicts, ", ")).With("from", from)
	}
	for _, p := range todo {
		// Restore creates the stream; the cluster's empty one goes first.
		if err := s.JS.DeleteStream(ctx, p.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return store.Classify(fmt.Errorf("replacing the cluster's empty %s: %w", p.stream, err))
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		imp, err := storagenode.ImportStream(ictx, src, s.NC, p.stream, p.replicas)
		cancel()
		if err != nil {
			return fmt.Errorf("%w (imported so far: %d of %d; %s is unchanged, run the import again to finish)", err, len(view.Imported), len(todo), from)
		}
		view.Imported = append(view.Imported, *imp)
		if !out.json {
			fmt.Fprintf(out.w, "imported %s: %d messages (sequences %d..%d), %d bytes, %d replicas, %s\n",
				imp.Stream, imp.Messages, imp.FirstSeq, imp.LastSeq, imp.Bytes, imp.Replicas, imp.Took.Round(time.Millisecond))
		}
	}
	boxStore, err := store.Open(ctx, src, s.Names)
	if err != nil {
		return fmt.Errorf("reading the box's signers: %w", err)
	}
	boxAnchor := store.Anchor{}
	if boxRoot, err := signing.LoadRoot(boxAuthDir); err == nil && boxRoot != nil {
		boxAnchor = store.Anchor{Root: boxRoot.PublicKey(), Source: store.TrustFromRootKey}
	}
	boxStore.TrustAnchor(boxAnchor)
	if view.Signers, err = signers.Adopt(ctx, boxStore, s, root, "imported from "+from); err != nil {
		return fmt.Errorf("carrying the box's signers over (the streams are imported; run the import again to finish): %w", err)
	}
	return out.emit(view, func(w io.Writer) {
		if len(view.Signers) > 0 {
			fmt.Fprintf(w, "signers of the box certified under the cluster's trust root, retired at the box's last sequences: %s\n", strings.Join(view.Signers, ", "))
		}
		if len(view.Already) > 0 {
			fmt.Fprintf(w, "already imported: %s\n", strings.Join(view.Already, ", "))
		}
		if len(view.Skipped) > 0 {
			fmt.Fprintf(w, "not carried over (live observations their writers rebuild, and leases): %s\n", strings.Join(view.Skipped, ", "))
		}
		fmt.Fprintf(w, "imported %d streams and buckets from %s; point agents, gateways and meshd at the cluster now\n", len(view.Imported), from)
	})
}
