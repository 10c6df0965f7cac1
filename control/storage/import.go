package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// ImportConfig says what Import copies and under which trust.
type ImportConfig struct {
	// From is the stopped single box's data dir (its --data).
	From string
	// FromAuthDir is the box's auth dir; default From/auth.
	FromAuthDir string
	// Root is the cluster's trust root, which certifies the box's signers.
	Root *signing.Key
	// Progress receives a line per imported stream; nil discards them.
	Progress io.Writer
}

// ImportReport is what Import did: `control storage import`'s answer.
type ImportReport struct {
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

// Import copies a stopped single box's store (its data dir) into the
// cluster s is connected to, stream by stream with JetStream's snapshot and
// restore: every commit, record, certificate and sequence as it was. It
// refuses before changing anything when a cluster stream already holds data
// of its own, and reading the box's store changes nothing there. Run again
// after a failure, it finishes what is left.
func Import(ctx context.Context, s *store.Store, cfg ImportConfig) (*ImportReport, error) {
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	from := cfg.From
	boxAuthDir := cfg.FromAuthDir
	if boxAuthDir == "" {
		boxAuthDir = filepath.Join(from, "auth")
	}
	box, err := openBox(ctx, from, boxAuthDir, s.Names)
	if err != nil {
		return nil, err
	}
	defer box.close()

	rep := &ImportReport{From: from}
	todo, err := planImport(ctx, s, box.js, rep)
	if err != nil {
		return nil, err
	}
	for _, p := range todo {
		// Restore creates the stream; the cluster's empty one goes first.
		if err := s.JS.DeleteStream(ctx, p.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, store.Classify(fmt.Errorf("replacing the cluster's empty %s: %w", p.stream, err))
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		imp, err := storagenode.ImportStream(ictx, box.nc, s.NC, p.stream, p.replicas)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w (imported so far: %d of %d; %s is unchanged, run the import again to finish)", err, len(rep.Imported), len(todo), from)
		}
		rep.Imported = append(rep.Imported, *imp)
		fmt.Fprintf(progress, "imported %s: %d messages (sequences %d..%d), %d bytes, %d replicas, %s\n",
			imp.Stream, imp.Messages, imp.FirstSeq, imp.LastSeq, imp.Bytes, imp.Replicas, imp.Took.Round(time.Millisecond))
	}

	boxStore, err := store.Open(ctx, box.nc, s.Names)
	if err != nil {
		return nil, fmt.Errorf("reading the box's signers: %w", err)
	}
	boxAnchor := store.Anchor{}
	if boxRoot, err := signing.LoadRoot(boxAuthDir); err == nil && boxRoot != nil {
		boxAnchor = store.Anchor{Root: boxRoot.PublicKey(), Source: store.TrustFromRootKey}
	}
	boxStore.TrustAnchor(boxAnchor)
	if rep.Signers, err = signers.Adopt(ctx, boxStore, s, cfg.Root, "imported from "+from); err != nil {
		return nil, fmt.Errorf("carrying the box's signers over (the streams are imported; run the import again to finish): %w", err)
	}
	return rep, nil
}

// box is a stopped single box's store, served by a private server for as
// long as the import reads it.
type box struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	stops []func()
}

func (b *box) close() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
}

// openBox locks the box's data dir and serves its store on a random
// loopback port, with the box's own keys when it required credentials.
func openBox(ctx context.Context, from, authDir string, names store.Names) (_ *box, err error) {
	layout, err := storagenode.ReadStoreLayout(from)
	if err != nil {
		return nil, err
	}
	switch {
	case layout.Clustered:
		return nil, store.Errorf(store.CodeInvalid, "%s is a storage node's store of a cluster, not a single box's", from).With("from", from)
	case len(layout.Accounts) == 0:
		return nil, store.Errorf(store.CodeNotFound, "%s holds no JetStream store (want the single box's --data dir)", from).With("from", from)
	case len(layout.Accounts) > 1:
		return nil, store.Errorf(store.CodeInvalid, "%s holds streams of %d accounts (%s); edgeplane writes one", from, len(layout.Accounts), strings.Join(layout.Accounts, ", ")).With("from", from)
	}
	b := &box{}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	release, err := storagenode.LockDataDir(from)
	if err != nil {
		return nil, err
	}
	b.stops = append(b.stops, release)

	cfg := storagenode.Config{DataDir: from, Listen: "127.0.0.1:0", ServerName: "edgeplane-import"}
	var creds string
	if acct := layout.Accounts[0]; acct != server.DEFAULT_GLOBAL_ACCOUNT {
		a, err := storagenode.LoadAuth(authDir, false)
		if err != nil {
			return nil, fmt.Errorf("the single box required credentials: %w", err)
		}
		if a.AccountPublicKey() != acct {
			return nil, store.Errorf(store.CodeInvalid, "auth dir %s is for account %s, the store holds account %s", authDir, a.AccountPublicKey(), acct).
				With("auth_dir", authDir)
		}
		cfg.Auth = a
		if layout.Encrypted {
			// Where the box's own start would find its key.
			place := storagenode.LocateStoreKey(from, authDir, "")
			key, err := os.ReadFile(place.File)
			if err != nil || len(strings.TrimSpace(string(key))) < 32 {
				return nil, store.Errorf(store.CodeInvalid, "%s is encrypted at rest, but its store key is not in %s", from, place.File).
					With("auth_dir", authDir).With("store_key", place.File)
			}
			cfg.StoreKey = strings.TrimSpace(string(key))
		}
		file, remove, err := a.TempCredsFile(storagenode.CredsRequest{Role: storagenode.RoleControl, Names: names, Name: "storage-import", TTL: time.Hour})
		if err != nil {
			return nil, err
		}
		b.stops = append(b.stops, remove)
		creds = file
	}
	ns, err := storagenode.Start(cfg)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", from, err)
	}
	b.stops = append(b.stops, func() { ns.Shutdown(); ns.WaitForShutdown() })
	if b.nc, err = store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: creds, Name: "control storage import"}); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, b.nc.Close)
	if b.js, err = jetstream.New(b.nc); err != nil {
		return nil, err
	}
	if err := store.WaitForJetStream(ctx, b.nc); err != nil {
		return nil, err
	}
	return b, nil
}

// streamImport is one stream to copy, at the cluster's replica count.
type streamImport struct {
	stream   string
	replicas int
}

// planImport compares the box's streams with the cluster's, recording in
// rep the ones already imported and the ones not carried over, and returns
// the ones to copy. It refuses when a cluster stream holds data of its own.
func planImport(ctx context.Context, s *store.Store, boxJS jetstream.JetStream, rep *ImportReport) ([]streamImport, error) {
	observation := map[string]bool{}
	for _, b := range s.Names.ObservationBuckets() {
		observation["KV_"+b] = true
	}
	// Leases are live coordination, not data: their holders (the box's
	// processes, the cluster's control servers, which take the fleet
	// status lease as they start) take them again.
	observation["KV_"+s.Names.LocksBucket()] = true
	// So are the control servers' announcements and the store's floor:
	// the cluster's servers announce themselves as they start, and raise
	// the floor again once every process they hear from is at it.
	observation["KV_"+s.Names.MetaBucket()] = true
	// The cluster keeps its own trust root and signers; the box's are
	// carried over by certificate (signers.Adopt), not copied.
	signersStream := "KV_" + s.Names.SignersBucket()
	// So does it its canary cookie key, made when its storage nodes
	// provisioned the store: a client's cookie from the box is no cookie
	// to the cluster's gateways, and it is bucketed again once.
	cookieKeyStream := "KV_" + s.Names.CanaryKeysBucket()
	var todo []streamImport
	var conflicts []string
	for _, name := range s.StreamNames() {
		old, err := boxJS.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // an older box without this stream: nothing to carry
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s in %s: %w", name, rep.From, err)
		}
		if observation[name] {
			rep.Skipped = append(rep.Skipped, name)
			continue
		}
		if name == signersStream || name == cookieKeyStream {
			continue
		}
		oldState := old.CachedInfo().State
		if oldState.LastSeq == 0 {
			continue // never written: the cluster's empty stream is the same
		}
		ci, err := s.StreamInfo(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, store.Errorf(store.CodeNotFound, "the cluster has no stream %s: start the storage nodes' `control server` first (it creates them)", name).
				With("stream", name)
		}
		if err != nil {
			return nil, store.Classify(fmt.Errorf("reading %s in the cluster: %w", name, err))
		}
		st := ci.State
		switch {
		case st.Msgs == oldState.Msgs && st.FirstSeq == oldState.FirstSeq && st.LastSeq == oldState.LastSeq:
			rep.Already = append(rep.Already, name)
		case st.Msgs == 0 && st.LastSeq == 0:
			todo = append(todo, streamImport{stream: name, replicas: ci.Config.Replicas})
		default:
			conflicts = append(conflicts, fmt.Sprintf("%s (%d messages)", name, st.Msgs))
		}
	}
	if len(conflicts) > 0 {
		return nil, store.Errorf(store.CodeConflict, "the cluster already holds data of its own in %s; import into a fresh cluster, before agents, gateways or deploys use it. Nothing was changed",
			strings.Join(conflicts, ", ")).With("from", rep.From)
	}
	return todo, nil
}
