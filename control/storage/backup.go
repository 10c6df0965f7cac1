package storage

import (
	"context"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// BackupHeader is what a backup says of itself, ahead of the snapshots.
type BackupHeader struct {
	Format       int       `json:"format"`
	Installation string    `json:"installation"`
	Authority    string    `json:"authority"`
	Taken        time.Time `json:"taken"`
	// Encrypted is true when the content is sealed with a key derived
	// from the store key (it opens with that key only).
	Encrypted bool           `json:"encrypted"`
	Streams   []BackupStream `json:"streams"`
	// ID is the header's SHA-256 (hex), read from the file: what a
	// restored stream's metadata names it by.
	ID string `json:"-"`
}

// RestoredFromMetadata is the stream metadata key a restore sets to the
// ID of the backup it restored the stream from: a restore run again after
// a failure leaves such streams as they are.
const RestoredFromMetadata = "edgeplane.restored_from"

// BackupStream is one stream's snapshot in a backup, in file order.
type BackupStream struct {
	storagenode.Snapshot
	Name string `json:"name"`
	// Size and SHA256 are the snapshot data's length and digest (hex).
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// BackupConfig says where a backup goes and how it is sealed.
type BackupConfig struct {
	// File is written whole or not at all (FILE.partial, renamed).
	File string
	// StoreKey, when set, seals the backup. A store encrypted at rest
	// (a storage node says so) is not backed up without it, unless
	// Plaintext: a stolen backup would read as the store does not.
	StoreKey  string
	Plaintext bool
	// Progress receives a line per stream; nil discards them.
	Progress io.Writer
}

// BackupReport is what Backup wrote.
type BackupReport struct {
	File      string         `json:"file"`
	Encrypted bool           `json:"encrypted"`
	Bytes     int64          `json:"bytes"`
	Streams   []StreamBackup `json:"streams"`
	// Missing names streams this store does not have (an older one).
	Missing []string      `json:"missing,omitempty"`
	Took    time.Duration `json:"took_ns"`
}

// StreamBackup is one stream of a BackupReport.
type StreamBackup struct {
	Stream   string `json:"stream"`
	Messages uint64 `json:"messages"`
	LastSeq  uint64 `json:"last_seq"`
	Size     int64  `json:"size"`
}

// streamTimeout bounds one stream's snapshot or restore: a server that
// stops sending or answering fails the command rather than hanging it.
const streamTimeout = 5 * time.Minute

// BackupStreams are the streams a backup of s holds: every stream and
// bucket of its layout, and the release binaries' object store.
func BackupStreams(s *store.Store) []string {
	return append(s.StreamNames(), "OBJ_"+s.Names.ReleaseBinariesStore())
}

// Backup writes an online backup of every stream and bucket of s to
// cfg.File: each stream's JetStream snapshot, taken while writes go on.
// Each snapshot is a point in time of its stream; the streams are taken one
// after another, so the backup as a whole is not one instant, and a
// restore is then a store gone back in time, which the fleet converges on.
func Backup(ctx context.Context, s *store.Store, cfg BackupConfig) (*BackupReport, error) {
	start := time.Now()
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	if cfg.StoreKey == "" && !cfg.Plaintext {
		if err := refusePlaintext(ctx, s); err != nil {
			return nil, err
		}
	}
	hdr := BackupHeader{Format: backupFormat, Installation: s.Names.Installation, Authority: s.Names.Authority,
		Taken: start.UTC(), Encrypted: cfg.StoreKey != ""}
	rep := &BackupReport{File: cfg.File, Encrypted: hdr.Encrypted}

	// The header goes first and holds each snapshot's size and digest, so
	// the snapshots are spooled beside the file until all are taken; the
	// spool is sealed with a key that lives in this process only, so that
	// not even a crash leaves the store's content readable on disk.
	spool, err := os.CreateTemp(filepath.Dir(cfg.File), ".backup-spool-*")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer func() {
		spool.Close()
		os.Remove(spool.Name())
	}()
	spoolKey := newSalt()
	spoolPre, spoolAEAD, err := sealedPreamble(string(spoolKey[:]))
	if err != nil {
		return nil, err
	}
	sw, err := newSegmentWriter(spool, spoolPre, spoolAEAD)
	if err != nil {
		return nil, fmt.Errorf("backup: spooling: %w", err)
	}
	for _, name := range BackupStreams(s) {
		if _, err := s.StreamInfo(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			rep.Missing = append(rep.Missing, name)
			continue
		} else if err != nil {
			return nil, store.Classify(fmt.Errorf("backup: reading %s: %w", name, err))
		}
		h := sha256.New()
		cw := &countingWriter{}
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, streamTimeout)
		snap, err := storagenode.SnapshotStream(sctx, s.NC, name, io.MultiWriter(sw, h, cw))
		cancel()
		if err != nil {
			return nil, store.Classify(fmt.Errorf("backup: %w", err))
		}
		hdr.Streams = append(hdr.Streams, BackupStream{Snapshot: *snap, Name: name, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))})
		rep.Streams = append(rep.Streams, StreamBackup{Stream: name, Messages: snap.State.Msgs, LastSeq: snap.State.LastSeq, Size: cw.n})
		fmt.Fprintf(progress, "snapshot of %s: %d messages (last sequence %d), %d bytes, %s\n",
			name, snap.State.Msgs, snap.State.LastSeq, cw.n, time.Since(t0).Round(time.Millisecond))
	}
	if err := sw.Close(); err != nil {
		return nil, fmt.Errorf("backup: spooling: %w", err)
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if _, err := readPreamble(spool); err != nil {
		return nil, fmt.Errorf("backup: reading the spool: %w", err)
	}
	spooled := newSegmentReader(spool, spoolPre, spoolAEAD)

	n, err := writeBackupFile(cfg.File, cfg.StoreKey, &hdr, spooled)
	if err != nil {
		return nil, err
	}
	rep.Bytes, rep.Took = n, time.Since(start)
	return rep, nil
}

// refusePlaintext refuses a backup in the clear of a store a storage node
// says is encrypted at rest.
func refusePlaintext(ctx context.Context, s *store.Store) error {
	answers, err := store.GatherStorageStatus(ctx, s.NC, s.Names, time.Second)
	if err != nil {
		return err
	}
	for _, a := range answers {
		if a.EncryptedAtRest {
			return store.Errorf(store.CodeInvalid, "the store is encrypted at rest (storage node %s): give its store key (--store-key FILE, or --data DIR on a storage node) "+
				"so that the backup is sealed too, or --plaintext to write it in the clear", a.Server).With("node", a.Server)
		}
	}
	return nil
}

// writeBackupFile writes hdr and the snapshots content holds to file,
// sealed under storeKey when it is set, whole or not at all: the file
// appears, synced, by a rename.
func writeBackupFile(file, storeKey string, hdr *BackupHeader, content io.Reader) (int64, error) {
	partial := file + ".partial"
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(partial)
		}
	}()
	pre, aead := preamble{format: backupFormat, cipher: cipherNone}, cipher.AEAD(nil)
	if storeKey != "" {
		if pre, aead, err = sealedPreamble(storeKey); err != nil {
			return 0, err
		}
	}
	w, err := newSegmentWriter(f, pre, aead)
	if err != nil {
		return 0, fmt.Errorf("backup: writing %s: %w", partial, err)
	}
	hj, err := json.Marshal(hdr)
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256(hj)
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(hj)))); err != nil {
		return 0, fmt.Errorf("backup: writing %s: %w", partial, err)
	}
	for _, b := range [][]byte{hj, sum[:]} {
		if _, err := w.Write(b); err != nil {
			return 0, fmt.Errorf("backup: writing %s: %w", partial, err)
		}
	}
	// Each stream in segments of its own, so that damage is named with
	// its stream.
	for _, st := range hdr.Streams {
		if err := w.Boundary(); err != nil {
			return 0, fmt.Errorf("backup: writing %s: %w", partial, err)
		}
		if _, err := io.CopyN(w, content, st.Size); err != nil {
			return 0, fmt.Errorf("backup: writing %s (%s): %w", partial, st.Name, err)
		}
	}
	if err := w.Close(); err != nil {
		return 0, fmt.Errorf("backup: writing %s: %w", partial, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("backup: syncing %s: %w", partial, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	done = true
	if err := os.Rename(partial, file); err != nil {
		os.Remove(partial)
		return 0, fmt.Errorf("backup: %w", err)
	}
	if d, err := os.Open(filepath.Dir(file)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return fi.Size(), nil
}

// countingWriter counts what goes through it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	return len(b), nil
}
