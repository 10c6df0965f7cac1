package storage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const testStoreKey = "0123456789abcdef0123456789abcdef-backup-test"

// deployN deploys namespace ns n times, one instance each.
func deployN(ctx context.Context, s *store.Store, ns string, n int) error {
	for i := range n {
		svc := storetest.Service{Routes: []store.Route{{Hosts: []string{ns + ".example.com"}}},
			Instances: []storetest.Instance{{ID: fmt.Sprintf("%s-%d", ns, i), Machine: "m1", Address: "127.0.0.1", Port: 9000 + i%100}}}
		if _, _, err := storetest.Deploy(ctx, s, ns, map[string]storetest.Service{"web": svc}); err != nil {
			return err
		}
	}
	return nil
}

// states reads the state of every stream a backup of s holds.
func states(t *testing.T, ctx context.Context, s *store.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range BackupStreams(s) {
		ci, err := s.StreamInfo(ctx, name)
		if err != nil {
			out[name] = err.Error()
			continue
		}
		out[name] = fmt.Sprintf("%d msgs %d..%d", ci.State.Msgs, ci.State.FirstSeq, ci.State.LastSeq)
	}
	return out
}

func sameStates(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s: %s is %q, was %q", what, k, b[k], v)
		}
	}
}

// An encrypted backup taken while deploys go on comes back whole into a
// fresh store, stream by stream as the header says; a second restore finds
// it done, and a store with data of its own is refused without --replace.
func TestBackupUnderLoadAndRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	src := storetest.Start(t)
	if err := deployN(ctx, src.Store, "shop", 20); err != nil {
		t.Fatal(err)
	}
	code, _, err := invites.Create(ctx, src.Store, invites.Spec{Region: "eu", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	// Deploys go on through the backup.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var loadErr error
	var loaded atomic.Int64
	wg.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			if err := deployN(loadCtx, src.Store, fmt.Sprintf("load%d", i%5), 1); err != nil {
				if loadCtx.Err() == nil {
					loadErr = err
				}
				return
			}
			loaded.Add(1)
		}
	})
	// The backup starts with deploys under way.
	for loaded.Load() < 3 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	file := filepath.Join(t.TempDir(), "store.backup")
	var progress bytes.Buffer
	rep, err := Backup(ctx, src.Store, BackupConfig{File: file, StoreKey: testStoreKey, Progress: &progress})
	during := loaded.Load()
	stopLoad()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if loadErr != nil {
		t.Fatalf("deploys during the backup: %v", loadErr)
	}
	t.Logf("backup: %d bytes in %s, %d deploys by then", rep.Bytes, rep.Took, during)
	if !rep.Encrypted || len(rep.Streams) != len(BackupStreams(src.Store)) || len(rep.Missing) != 0 {
		t.Fatalf("report: %+v", rep)
	}
	if n := strings.Count(progress.String(), "\n"); n != len(rep.Streams) {
		t.Fatalf("%d progress lines for %d streams:\n%s", n, len(rep.Streams), progress.String())
	}
	if ents, _ := os.ReadDir(filepath.Dir(file)); len(ents) != 1 {
		t.Fatalf("the backup left %d files beside it, want the backup alone", len(ents))
	}
	// Sealed: no record of the store reads in the clear.
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("shop.example.com")) || bytes.Contains(raw, []byte(src.Store.Names.DeployCommitsStream())) {
		t.Fatal("the encrypted backup holds the store's names in the clear")
	}
	hdr, err := VerifyBackup(file, testStoreKey)
	if err != nil {
		t.Fatal(err)
	}

	dst := storetest.Start(t)
	rrep, err := Restore(ctx, dst.Store, RestoreConfig{File: file, StoreKey: testStoreKey})
	if err != nil {
		t.Fatal(err)
	}
	if len(rrep.Restored)+len(rrep.Already)+len(rrep.Skipped) != len(hdr.Streams) || len(rrep.Skipped) == 0 || len(rrep.Replaced) != 0 {
		t.Fatalf("restore report: %+v", rrep)
	}
	// Each stream holds what its snapshot began with, and perhaps writes
	// made while it was read.
	for _, st := range hdr.Streams {
		if slices.Contains(rrep.Skipped, st.Name) {
			continue
		}
		ci, err := dst.Store.StreamInfo(ctx, st.Name)
		if err != nil {
			t.Fatal(err)
		}
		if ci.State.LastSeq < st.State.LastSeq || ci.State.FirstSeq != st.State.FirstSeq || (st.State.Msgs > 0) != (ci.State.Msgs > 0) {
			t.Fatalf("%s restored as %+v, the backup began at %+v", st.Name, ci.State, st.State)
		}
	}
	// The commits are the source's, one for one.
	commits := src.Store.Names.DeployCommitsStream()
	for seq := uint64(1); seq <= 20; seq++ {
		a, err := storetest.Stream(t, src.Store, commits).GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		b, err := storetest.Stream(t, dst.Store, commits).GetMsg(ctx, seq)
		if err != nil || !bytes.Equal(a.Data, b.Data) || a.Subject != b.Subject {
			t.Fatalf("commit %d restored as %v, %v", seq, b, err)
		}
	}
	// The data is the source's: its invite is redeemable here.
	if _, err := invites.Redeem(ctx, dst.Store, code, "m9", store.InviteUseAdmit); err != nil {
		t.Fatalf("the source's invite in the restored store: %v", err)
	}

	// Again, into a fresh store that took the first part already.
	again := storetest.Start(t)
	if _, err := Restore(ctx, again.Store, RestoreConfig{File: file, StoreKey: testStoreKey}); err != nil {
		t.Fatal(err)
	}
	arep, err := Restore(ctx, again.Store, RestoreConfig{File: file, StoreKey: testStoreKey})
	if err != nil || len(arep.Restored) != 0 || len(arep.Already) == 0 {
		t.Fatalf("a second restore: %+v, %v", arep, err)
	}

	// A store with data of its own (an invite): refused, and nothing
	// changes; --replace puts the backup's in its place.
	other := storetest.Start(t)
	if _, _, err := invites.Create(ctx, other.Store, invites.Spec{Region: "us", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	before := states(t, ctx, other.Store)
	_, err = Restore(ctx, other.Store, RestoreConfig{File: file, StoreKey: testStoreKey})
	if se := store.AsError(err); se.Code != store.CodeConflict || !strings.Contains(se.Message, "KV_"+other.Store.Names.InvitesBucket()+" (1 messages)") ||
		!strings.Contains(se.Message, "Nothing was written") {
		t.Fatalf("restore over data: %v", err)
	}
	sameStates(t, "after the refused restore", before, states(t, ctx, other.Store))
	prep, err := Restore(ctx, other.Store, RestoreConfig{File: file, StoreKey: testStoreKey, Replace: true})
	if err != nil || !slices.Equal(prep.Replaced, []string{"KV_" + other.Store.Names.InvitesBucket()}) {
		t.Fatalf("restore --replace: %+v, %v", prep, err)
	}
	if _, err := invites.Redeem(ctx, other.Store, code, "m9", store.InviteUseAdmit); err != nil {
		t.Fatalf("the invite after restore --replace: %v", err)
	}
}

// A backup with a byte flipped anywhere, or cut anywhere, or opened with
// another key, is refused before anything is written, with what is wrong
// and where; sealed and in the clear alike.
func TestCorruptOrTruncatedBackupIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	src := storetest.Start(t)
	if err := deployN(ctx, src.Store, "shop", 10); err != nil {
		t.Fatal(err)
	}
	dst := storetest.Start(t)
	before := states(t, ctx, dst.Store)
	refused := func(what string, data []byte, key string, want ...string) {
		t.Helper()
		bad := filepath.Join(t.TempDir(), "bad.backup")
		if err := os.WriteFile(bad, data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Restore(ctx, dst.Store, RestoreConfig{File: bad, StoreKey: key})
		se := store.AsError(err)
		if se.Code != store.CodeInvalid {
			t.Fatalf("%s: %v", what, err)
		}
		for _, w := range want {
			if !strings.Contains(se.Message, w) {
				t.Fatalf("%s: %q does not say %q", what, se.Message, w)
			}
		}
		t.Logf("%s: %s", what, se.Message)
	}
	for _, key := range []string{testStoreKey, ""} {
		file := filepath.Join(t.TempDir(), "store.backup")
		if _, err := Backup(ctx, src.Store, BackupConfig{File: file, StoreKey: key}); err != nil {
			t.Fatal(err)
		}
		good, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		kind := fmt.Sprintf("encrypted %t", key != "")
		for _, at := range []int{3, preambleSize + 2, preambleSize + 40, len(good) / 3, len(good) / 2, len(good) - 1} {
			flipped := bytes.Clone(good)
			flipped[at] ^= 0x20
			refused(fmt.Sprintf("%s, byte %d of %d flipped", kind, at, len(good)), flipped, key, "nothing was written")
		}
		for _, at := range []int{0, 5, preambleSize, preambleSize + 3, len(good) / 2, len(good) - 100, len(good) - 1} {
			refused(fmt.Sprintf("%s, cut at %d of %d", kind, at, len(good)), good[:at], key, "nothing was written", "truncated")
		}
		refused(kind+", a byte appended", append(bytes.Clone(good), 0), key, "nothing was written", "corrupt")
		if key != "" {
			refused("another key", good, strings.Repeat("k", 40), "nothing was written", "not the store key")
			refused("no key", good, "", "encrypted", "give the store key")
		}
		// A flipped byte in a stream's snapshot is named with its
		// stream. The header, then each stream, is one segment here:
		// length, payload (and its tag when sealed).
		hdr, err := VerifyBackup(file, key)
		if err != nil {
			t.Fatal(err)
		}
		opened, err := openBackup(file, key)
		if err != nil {
			t.Fatal(err)
		}
		opened.f.Close()
		tag := 0
		if key != "" {
			tag = 16
		}
		off := preambleSize + 4 + 4 + opened.headerLen + 32 + tag
		for _, st := range hdr.Streams {
			if st.Size >= segmentSize {
				t.Fatalf("%s holds %d bytes: the offsets here assume one segment per stream", st.Name, st.Size)
			}
			if st.Size == 0 {
				continue
			}
			off += 4
			if st.Name == src.Store.Names.DeployCommitsStream() {
				flipped := bytes.Clone(good)
				flipped[off+int(st.Size)/2] ^= 1
				refused(kind+", a flipped byte in the commits' snapshot", flipped, key, "nothing was written", "stream "+st.Name+": ")
			}
			off += int(st.Size) + tag
		}
		if off != len(good) {
			t.Fatalf("the streams end at %d, the file at %d", off, len(good))
		}
	}
	sameStates(t, "after refused restores", before, states(t, ctx, dst.Store))
}

// A store encrypted at rest is not backed up in the clear by mistake: the
// storage node says it is encrypted, and a backup without its key is
// refused unless asked for in the clear.
func TestEncryptedStoreIsNotBackedUpInTheClear(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "jetstream.key")
	if err := os.WriteFile(keyFile, []byte(testStoreKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	box := bootEncryptedBox(t, filepath.Join(dir, "box"), filepath.Join(dir, "auth"), keyFile)
	file := filepath.Join(dir, "store.backup")
	_, err := Backup(ctx, box.Store, BackupConfig{File: file})
	if se := store.AsError(err); se.Code != store.CodeInvalid || !strings.Contains(se.Message, "encrypted at rest (storage node edgeplane)") {
		t.Fatalf("a backup in the clear of an encrypted store: %v", err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the refused backup left %s: %v", file, err)
	}
	if rep, err := Backup(ctx, box.Store, BackupConfig{File: file, Plaintext: true}); err != nil || rep.Encrypted {
		t.Fatalf("--plaintext: %+v, %v", rep, err)
	}
	if rep, err := Backup(ctx, box.Store, BackupConfig{File: file, StoreKey: testStoreKey}); err != nil || !rep.Encrypted {
		t.Fatalf("with the key: %+v, %v", rep, err)
	}
	if _, err := VerifyBackup(file, testStoreKey); err != nil {
		t.Fatal(err)
	}
}
