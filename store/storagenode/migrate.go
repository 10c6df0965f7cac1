package storagenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// StoreLayout is what a data dir's JetStream store holds on disk.
type StoreLayout struct {
	// Dir is the JetStream store directory inside the data dir.
	Dir string
	// Accounts names the accounts holding streams ("$G" for a server
	// without credentials, an account public key with them).
	Accounts []string
	// Clustered is true when the store belongs to a storage node of a
	// JetStream cluster (it holds the meta group's RAFT state).
	Clustered bool
	// Encrypted is true when its streams are encrypted at rest: it opens
	// with the store key it was written with only.
	Encrypted bool
}

// Standalone reports whether the store holds streams written by a server
// that was not clustered: a single box.
func (l *StoreLayout) Standalone() bool { return !l.Clustered && len(l.Accounts) > 0 }

// ReadStoreLayout inspects the JetStream store StartEmbedded keeps under
// dataDir without starting a server. A missing store is an empty layout.
func ReadStoreLayout(dataDir string) (*StoreLayout, error) {
	// The server keeps its files in a "jetstream" directory inside the
	// StoreDir we give it (DATA/jetstream).
	l := &StoreLayout{Dir: filepath.Join(dataDir, "jetstream", "jetstream")}
	ents, err := os.ReadDir(l.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading store %s: %w", l.Dir, err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		acc := filepath.Join(l.Dir, e.Name())
		if _, err := os.Stat(filepath.Join(acc, "_js_", "_meta_")); err == nil {
			l.Clustered = true
		}
		streams, err := os.ReadDir(filepath.Join(acc, "streams"))
		if err == nil && len(streams) > 0 {
			l.Accounts = append(l.Accounts, e.Name())
		}
		for _, st := range streams {
			// nats-server keeps an encrypted stream's key beside its
			// metadata.
			if _, err := os.Stat(filepath.Join(acc, "streams", st.Name(), "meta.key")); err == nil {
				l.Encrypted = true
			}
		}
	}
	sort.Strings(l.Accounts)
	return l, nil
}

// ErrSingleBoxStore explains why a single box's store cannot become a
// storage node's store in place.
var ErrSingleBoxStore = errors.New("holds a single-box store: a clustered server treats its streams as orphans and deletes them")

// CheckClusterable refuses to start a clustered storage node on dataDir when
// it holds a single box's streams; the operator moves the dir aside and
// imports it (ImportStream) into the running cluster instead.
func CheckClusterable(dataDir string) error {
	l, err := ReadStoreLayout(dataDir)
	if err != nil {
		return err
	}
	if l.Standalone() {
		return store.Errorf(store.CodeInvalid, "data dir %s %w; move it aside, start this node with an empty --data, and once the cluster is up run `control storage import --from <moved dir>`", dataDir, ErrSingleBoxStore).
			With("data", dataDir)
	}
	return nil
}

// LockDataDir takes an exclusive lock on dataDir's store for as long as the
// process holds it (release, or exit). nats-server does not lock its store
// directory, and two servers on one store corrupt it: a second `control
// server` on the same --data, or an import from a store still in use.
func LockDataDir(dataDir string) (release func(), err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dataDir, "store.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, store.Errorf(store.CodeBusy, "data dir %s is in use by another process (a running control server?): stop it first", dataDir).
				With("data", dataDir)
		}
		return nil, fmt.Errorf("locking data dir %s: %w", dataDir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// StreamImport reports one stream copied by ImportStream.
type StreamImport struct {
	Stream   string        `json:"stream"`
	Messages uint64        `json:"messages"`
	Bytes    uint64        `json:"bytes"`
	FirstSeq uint64        `json:"first_seq"`
	LastSeq  uint64        `json:"last_seq"`
	Replicas int           `json:"replicas"`
	Took     time.Duration `json:"took_ns"`
}

// snapshotChunk is the chunk size asked of the source server; well below
// every server's max payload.
const snapshotChunk = 128 << 10

// ImportStream copies stream, with its messages, sequences, headers and
// durable consumers, from the server behind src into the one behind dst
// using JetStream's own snapshot and restore, with replicas replicas. The
// stream must not exist on dst. The source is only read.
func ImportStream(ctx context.Context, src, dst *nats.Conn, stream string, replicas int) (*StreamImport, error) {
	start := time.Now()
	deliver := src.NewInbox()
	chunks, err := src.SubscribeSync(deliver)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", stream, err)
	}
	defer chunks.Unsubscribe()
	// The source waits for this interest before sending.
	if err := src.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("import %s: %w", stream, err)
	}
	var snap server.JSApiStreamSnapshotResponse
	if err := jsAPI(ctx, src, fmt.Sprintf(server.JSApiStreamSnapshotT, stream),
		server.JSApiStreamSnapshotRequest{DeliverSubject: deliver, ChunkSize: snapshotChunk}, &snap, &snap.ApiResponse); err != nil {
		return nil, fmt.Errorf("import %s: snapshot: %w", stream, err)
	}
	if snap.Config == nil || snap.State == nil {
		return nil, fmt.Errorf("import %s: snapshot answer without config or state", stream)
	}
	cfg := *snap.Config
	cfg.Replicas = replicas
	// A single box may keep its observations unsynced (async persist
	// mode); JetStream refuses that on a replicated stream, and a cluster's
	// streams must be free to gain replicas: the copy is synced.
	cfg.PersistMode = server.DefaultPersistMode
	rest, err := startRestore(ctx, dst, server.JSApiStreamRestoreRequest{Config: cfg, State: *snap.State})
	if err != nil {
		return nil, fmt.Errorf("import %s: restore: %w", stream, err)
	}
	for {
		m, err := chunks.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("import %s: waiting for snapshot data: %w", stream, err)
		}
		if len(m.Data) == 0 {
			// The end, with the snapshot's verdict as a status header.
			if st := m.Header.Get("Status"); st != "" && st != "204" {
				return nil, fmt.Errorf("import %s: snapshot failed: %s %s", stream, st, m.Header.Get("Description"))
			}
			break
		}
		// Each chunk goes to the restore and is acknowledged by it before
		// the snapshot gets its flow-control ack: nothing piles up here.
		if err := restoreChunk(ctx, dst, rest.DeliverSubject, m.Data); err != nil {
			return nil, fmt.Errorf("import %s: restore: %w", stream, err)
		}
		if m.Reply != "" {
			if err := m.Respond(nil); err != nil {
				return nil, fmt.Errorf("import %s: %w", stream, err)
			}
		}
	}
	imp, err := endRestore(ctx, dst, stream, rest.DeliverSubject, replicas, start, func(st server.StreamState) error {
		if st.Msgs != snap.State.Msgs || st.LastSeq != snap.State.LastSeq {
			return fmt.Errorf("restored %d messages up to sequence %d, the source had %d up to %d",
				st.Msgs, st.LastSeq, snap.State.Msgs, snap.State.LastSeq)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("import %s: restore: %w", stream, err)
	}
	return imp, nil
}

// settled reports whether a stream has a leader and every other replica is
// current.
func settled(ci *jetstream.ClusterInfo, replicas int) bool {
	if ci == nil {
		return true // not clustered
	}
	if ci.Leader == "" || len(ci.Replicas) < replicas-1 {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current {
			return false
		}
	}
	return true
}

// restoreRequest sends one restore message. In a cluster the restore's
// subscription lives on the stream leader's server and its interest reaches
// the server we are connected to a moment after the restore request was
// answered: until then there is "no responder", and the message was not
// delivered, so it is sent again.
func restoreRequest(ctx context.Context, nc *nats.Conn, subject string, data []byte) (*nats.Msg, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := nc.RequestWithContext(ctx, subject, data)
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return m, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// jsAPI sends a JetStream API request and decodes the answer into resp,
// whose embedded ApiResponse is api.
func jsAPI(ctx context.Context, nc *nats.Conn, subject string, req, resp any, api *server.ApiResponse) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return store.Classify(err)
	}
	if err := json.Unmarshal(m.Data, resp); err != nil {
		return fmt.Errorf("undecodable answer: %w", err)
	}
	if api.Error != nil {
		return api.Error
	}
	return nil
}
