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
	"hash"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// RestoreConfig says what Restore brings back and what it may replace.
type RestoreConfig struct {
	File string
	// StoreKey opens a sealed backup: the store key of the installation
	// the backup was taken of.
	StoreKey string
	// Replace lets the restore delete streams that hold data of their
	// own; without it they are a refusal, and nothing is written.
	Replace bool
	// Progress receives a line per stream; nil discards them.
	Progress io.Writer
}

// RestoreReport is what Restore did.
type RestoreReport struct {
	File  string    `json:"file"`
	Taken time.Time `json:"taken"`
	// Restored are the streams brought back, Already those that held the
	// backup's messages already (a restore run again), Replaced those of
	// Restored that held data of their own (--replace).
	Restored []storagenode.StreamImport `json:"restored"`
	Already  []string                   `json:"already_restored,omitempty"`
	Replaced []string                   `json:"replaced,omitempty"`
	// Skipped are live observations and leases: their writers rebuild
	// them, and a lease restored would be held by no one until its TTL.
	Skipped []string      `json:"skipped,omitempty"`
	Took    time.Duration `json:"took_ns"`
}

// backupFile is an open backup, its header read and checked.
type backupFile struct {
	f       *os.File
	header  BackupHeader
	content io.Reader
	// headerLen is the header JSON's length.
	headerLen int
}

// openBackup opens file and reads its header: the preamble, the header's
// length, JSON and digest, with the segments that hold them opened (under
// storeKey when the backup is sealed).
func openBackup(file, storeKey string) (_ *backupFile, err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("opening backup: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	pre, err := readPreamble(f)
	if err != nil {
		return nil, refuse(file, "", err)
	}
	var aead cipher.AEAD
	if pre.cipher == cipherAESGCM {
		if storeKey == "" {
			return nil, store.Errorf(store.CodeInvalid, "backup %s is encrypted: give the store key it was taken with (--store-key FILE, or --data DIR on a storage node)", file).
				With("file", file)
		}
		if aead, err = openPreamble(pre, storeKey); err != nil {
			return nil, refuse(file, "", err)
		}
	}
	r := newSegmentReader(f, pre, aead)
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, refuse(file, "", fmt.Errorf("reading the header: %w", truncatedIfEOF(err)))
	}
	l := binary.BigEndian.Uint32(lb[:])
	if l > maxHeaderSize {
		return nil, refuse(file, "", fmt.Errorf("header length %d: the file is corrupt", l))
	}
	hj := make([]byte, int(l)+sha256.Size)
	if _, err := io.ReadFull(r, hj); err != nil {
		return nil, refuse(file, "", fmt.Errorf("reading the header: %w", truncatedIfEOF(err)))
	}
	if sum := sha256.Sum256(hj[:l]); string(sum[:]) != string(hj[l:]) {
		return nil, refuse(file, "", errors.New("the header does not match its SHA-256: the file is corrupt"))
	}
	b := &backupFile{f: f, content: r, headerLen: int(l)}
	if err := json.Unmarshal(hj[:l], &b.header); err != nil {
		return nil, refuse(file, "", fmt.Errorf("undecodable header: %w", err))
	}
	b.header.ID = hex.EncodeToString(hj[l:])
	if b.header.Format != backupFormat || b.header.Encrypted != (aead != nil) {
		return nil, refuse(file, "", fmt.Errorf("the header (format %d, encrypted %t) contradicts the preamble", b.header.Format, b.header.Encrypted))
	}
	return b, nil
}

// stream returns a reader of the next stream's snapshot that checks, as it
// reaches the end, that the data is whole and matches the header's digest.
func (b *backupFile) stream(st BackupStream) io.Reader {
	return &checkedStream{r: io.LimitReader(b.content, st.Size), h: sha256.New(), st: st}
}

// end checks that nothing but the end follows the last stream.
func (b *backupFile) end() error {
	var one [1]byte
	n, err := b.content.Read(one[:])
	switch {
	case n > 0:
		return errors.New("bytes follow the last stream: the file is corrupt")
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return b.end()
	default:
		return fmt.Errorf("after the last stream: %w", err)
	}
}

// checkedStream reads one stream's snapshot, failing at its end when the
// bytes are fewer than the header says or their digest is not the header's.
type checkedStream struct {
	r    io.Reader
	h    hash.Hash
	st   BackupStream
	read int64
}

func (c *checkedStream) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	c.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if c.read < c.st.Size {
			return n, fmt.Errorf("it holds %d of its %d bytes: %w", c.read, c.st.Size, errTruncated)
		}
		if got := hex.EncodeToString(c.h.Sum(nil)); got != c.st.SHA256 {
			return n, fmt.Errorf("its SHA-256 is %s, the header says %s: the file is corrupt", got, c.st.SHA256)
		}
	}
	return n, err
}

// truncatedIfEOF reads an end of file as a truncated backup.
func truncatedIfEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}

// refuse is a backup refused: which stream, what is wrong, and that nothing
// was written.
func refuse(file, stream string, err error) error {
	if stream != "" {
		return store.Errorf(store.CodeInvalid, "backup %s is refused, nothing was written: stream %s: %v", file, stream, err).
			With("file", file).With("stream", stream)
	}
	return store.Errorf(store.CodeInvalid, "backup %s is refused, nothing was written: %v", file, err).With("file", file)
}

// VerifyBackup reads the whole of file, opening every segment and checking
// the header's digest and every stream's size and digest, and returns the
// header. It writes nothing anywhere.
func VerifyBackup(file, storeKey string) (*BackupHeader, error) {
	b, err := openBackup(file, storeKey)
	if err != nil {
		return nil, err
	}
	defer b.f.Close()
	for _, st := range b.header.Streams {
		if _, err := io.Copy(io.Discard, b.stream(st)); err != nil {
			return nil, refuse(file, st.Name, truncatedIfEOF(err))
		}
	}
	if err := b.end(); err != nil {
		return nil, refuse(file, "", err)
	}
	return &b.header, nil
}

// streamRestore is what Restore does with one stream of a backup.
type streamRestore struct {
	// restore is false for a stream left as it is (skipped, already).
	restore  bool
	exists   bool
	replicas int
}

// Restore brings back the backup in cfg.File into the store s is connected
// to: a fresh single box or cluster (its `control server` started on empty
// data dirs), or, with cfg.Replace, one whose streams hold data of their
// own. The whole file is verified first (every segment, size and digest):
// a corrupt, truncated or wrongly keyed backup is refused, and so is a
// store holding data without cfg.Replace, before anything is written. Run
// again after a failure, it finishes what is left.
func Restore(ctx context.Context, s *store.Store, cfg RestoreConfig) (*RestoreReport, error) {
	start := time.Now()
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	hdr, err := VerifyBackup(cfg.File, cfg.StoreKey)
	if err != nil {
		return nil, err
	}
	if hdr.Installation != s.Names.Installation || hdr.Authority != s.Names.Authority {
		return nil, store.Errorf(store.CodeInvalid, "backup %s is of installation %s authority %s, this store is installation %s authority %s; nothing was written",
			cfg.File, hdr.Installation, hdr.Authority, s.Names.Installation, s.Names.Authority).With("file", cfg.File)
	}
	rep := &RestoreReport{File: cfg.File, Taken: hdr.Taken}
	plan, err := planRestore(ctx, s, hdr, cfg.Replace, rep)
	if err != nil {
		return nil, err
	}

	b, err := openBackup(cfg.File, cfg.StoreKey)
	if err != nil {
		return nil, err
	}
	defer b.f.Close()
	for i, st := range b.header.Streams {
		p := plan[i]
		data := b.stream(st)
		if !p.restore {
			if _, err := io.Copy(io.Discard, data); err != nil {
				return nil, fmt.Errorf("restore: %s changed after it was verified: stream %s: %w", cfg.File, st.Name, err)
			}
			continue
		}
		if p.exists {
			// A restore creates its stream: the one there goes first.
			if err := s.JS.DeleteStream(ctx, st.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, store.Classify(fmt.Errorf("restore: replacing %s: %w", st.Name, err))
			}
		}
		rctx, cancel := context.WithTimeout(ctx, streamTimeout)
		imp, err := storagenode.RestoreStream(rctx, s.NC, st.Snapshot, data, p.replicas, map[string]string{RestoredFromMetadata: hdr.ID})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w (restored so far: %d streams; run the restore again to finish)", store.Classify(err), len(rep.Restored))
		}
		rep.Restored = append(rep.Restored, *imp)
		fmt.Fprintf(progress, "restored %s: %d messages (sequences %d..%d), %d bytes, %d replicas, %s\n",
			imp.Stream, imp.Messages, imp.FirstSeq, imp.LastSeq, imp.Bytes, imp.Replicas, imp.Took.Round(time.Millisecond))
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// planRestore decides, for each stream of hdr in order, whether it is
// restored, recording in rep the ones skipped and already restored. It
// refuses when a stream holds data of its own and replace is false.
func planRestore(ctx context.Context, s *store.Store, hdr *BackupHeader, replace bool, rep *RestoreReport) ([]streamRestore, error) {
	// Leases, the control servers' announcements and the store's floor
	// are live: their writers (the target's control servers) write them
	// again, the floor once every process they hear from is at it.
	live := map[string]bool{"KV_" + s.Names.LocksBucket(): true, "KV_" + s.Names.MetaBucket(): true}
	for _, b := range s.Names.ObservationBuckets() {
		live["KV_"+b] = true
	}
	// What a `control server` writes as it first starts (its trust root
	// and signer, the canary cookie key): the backup's replace them, as a
	// fresh store's own; each server certifies its signer again as it
	// starts on the restored store.
	bootstrap := map[string]bool{"KV_" + s.Names.SignersBucket(): true, "KV_" + s.Names.CanaryKeysBucket(): true}
	// The agents' observations of their instances: an agent writes its
	// record again as soon as it reconnects, so records the target holds
	// already are newer than the backup's, and stay; a target without any
	// gets the backup's.
	observed := "KV_" + s.Names.ObservedBucket()
	// A stream the target does not have yet takes the replica count the
	// installation's commits have there.
	defReplicas := 1
	if ci, err := s.StreamInfo(ctx, s.Names.DeployCommitsStream()); err == nil {
		defReplicas = ci.Config.Replicas
	}
	plan := make([]streamRestore, len(hdr.Streams))
	var conflicts []string
	for i, st := range hdr.Streams {
		if live[st.Name] {
			rep.Skipped = append(rep.Skipped, st.Name)
			continue
		}
		ci, err := s.StreamInfo(ctx, st.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			plan[i] = streamRestore{restore: true, replicas: defReplicas}
			continue
		}
		if err != nil {
			return nil, store.Classify(fmt.Errorf("restore: reading %s: %w", st.Name, err))
		}
		plan[i] = streamRestore{restore: true, exists: true, replicas: ci.Config.Replicas}
		have := ci.State
		// Empty on both sides, nothing to bring back; or restored from
		// this backup by a run before this one.
		already := have.LastSeq == 0 && st.State.LastSeq == 0 && have.FirstSeq == st.State.FirstSeq ||
			ci.Config.Metadata[RestoredFromMetadata] == hdr.ID
		switch {
		case already:
			rep.Already = append(rep.Already, st.Name)
			plan[i].restore = false
		case have.LastSeq == 0 || bootstrap[st.Name]:
		case st.Name == observed:
			rep.Skipped = append(rep.Skipped, st.Name)
			plan[i].restore = false
		case replace:
			rep.Replaced = append(rep.Replaced, st.Name)
		default:
			conflicts = append(conflicts, fmt.Sprintf("%s (%d messages)", st.Name, have.Msgs))
		}
	}
	if len(conflicts) > 0 {
		return nil, store.Errorf(store.CodeConflict, "the store already holds data of its own in %s: restore into a fresh store (`control server` on empty data dirs), "+
			"or give --replace to put the backup's in its place. Nothing was written", strings.Join(conflicts, ", ")).With("file", rep.File)
	}
	return plan, nil
}
