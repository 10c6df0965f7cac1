package storagenode

import (
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/minio/highwayhash"
	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/chacha20"
	"golang.org/x/crypto/chacha20poly1305"
)

// A storage node reads every message block of its store before its server
// opens it, because nats-server v2.15.2 does not: when the stream's
// index.db matches the last block's final checksum it trusts the index and
// reads no block at all, so a flipped bit in any other record surfaces
// only when that message is read (then the server truncates the block at
// the bad record and carries on with a hole); and when it does rebuild a
// block, it truncates the file at the first bad record and, at most,
// counts the loss in StreamState.Lost, which no later start remembers.
// Either way the store would serve holes silently. The check is read-only,
// so a refused start leaves the evidence on disk and stays refused.
//
// The record layout and keys below are nats-server v2.15.2's file store
// (filestore.go: rebuildStateFromBufLocked, loadEncryptionForMsgBlock,
// hashKeyForBlock; jetstream.go: jsKeyGen, decryptMeta).
const (
	blkRecordHeader = 22            // msgHdrSize: length, sequence, timestamp, subject length
	blkRecordHash   = 8             // recordHashSize: highwayhash-64 of the record
	blkHeadersBit   = 1 << 31       // hbit: the record carries headers
	blkMaxRecord    = 32 << 20      // rlBadThresh: no sane record is longer
	blkSeqFlags     = 1<<63 | 1<<62 // ebit, tbit: an erased message, a tombstone
	indexMagic      = 11            // fullStateMagic of index.db
)

// BlockDamage is a message block of the JetStream store whose records do
// not read back as written.
type BlockDamage struct {
	// Account and Stream name the stream the block belongs to.
	Account string `json:"account"`
	Stream  string `json:"stream"`
	// File is the block's path; Offset where its first bad record starts.
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	// Problem says what is wrong there.
	Problem string `json:"problem"`
	// Replicas is the stream's replica count from its own config: with
	// more than one, the other nodes hold a copy to rebuild from. 0 when
	// the config could not be read.
	Replicas int `json:"replicas,omitempty"`
}

func (d BlockDamage) String() string {
	return fmt.Sprintf("%s (stream %s): %s at offset %d", d.File, d.Stream, d.Problem, d.Offset)
}

// CheckStore reads every message block of the JetStream store of dataDir
// (a Config's DataDir) and returns the blocks whose records fail
// their checksum, do not parse, or stop short of their length: a flipped
// bit, a truncated file, a block key that no longer opens. storeKey is the
// key the store is encrypted with at rest, "" when it is not.
//
// One thing is not damage: a partial record at the very end of a stream's
// last block that the stream's index.db does not know of, what an append
// cut off by a power failure leaves. It was never acknowledged (the store
// syncs before it acknowledges, Config.SyncInterval, and writes its index
// from what it synced), and the server drops it as it starts. A block
// truncated anywhere else, or short of what its index knew, and a bad
// checksum anywhere, are damage. A block truncated exactly between two
// records of the last block is not seen (nor by the server).
func CheckStore(dataDir, storeKey string) ([]BlockDamage, error) {
	// nats-server keeps its accounts in a jetstream dir of its StoreDir.
	storeDir := filepath.Join(dataDir, "jetstream", server.JetStreamStoreDir)
	accounts, err := os.ReadDir(storeDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checking the store: %w", err)
	}
	var out []BlockDamage
	for _, acc := range accounts {
		streamsDir := filepath.Join(storeDir, acc.Name(), "streams")
		streams, err := os.ReadDir(streamsDir)
		if errors.Is(err, fs.ErrNotExist) || !acc.IsDir() {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("checking the store: %w", err)
		}
		for _, st := range streams {
			if !st.IsDir() {
				continue
			}
			sc := streamCheck{account: acc.Name(), stream: st.Name(), dir: filepath.Join(streamsDir, st.Name()), storeKey: storeKey}
			d, err := sc.check()
			if err != nil {
				return nil, fmt.Errorf("checking stream %s: %w", st.Name(), err)
			}
			out = append(out, d...)
		}
	}
	return out, nil
}

// streamCheck checks the blocks of one stream's directory.
type streamCheck struct {
	account, stream, dir, storeKey string
}

func (sc streamCheck) check() ([]BlockDamage, error) {
	msgs := filepath.Join(sc.dir, "msgs")
	entries, err := os.ReadDir(msgs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var blocks []uint32
	for _, e := range entries {
		// Not N.blk.tmp, a compaction's leftover the server removes.
		num, ok := strings.CutSuffix(e.Name(), ".blk")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(num, 10, 32); err == nil {
			blocks = append(blocks, uint32(n))
		}
	}
	sort.Slice(blocks, func(i, j int) bool { return blocks[i] < blocks[j] })
	var out []BlockDamage
	for i, index := range blocks {
		file := filepath.Join(msgs, fmt.Sprintf("%d.blk", index))
		off, problem, err := sc.checkBlock(file, index, i == len(blocks)-1)
		if err != nil {
			return nil, err
		}
		if problem != "" {
			out = append(out, BlockDamage{Account: sc.account, Stream: sc.stream, File: file, Offset: off, Problem: problem})
		}
	}
	if len(out) > 0 {
		replicas := sc.replicas()
		for i := range out {
			out[i].Replicas = replicas
		}
	}
	return out, nil
}

// checkBlock returns where the block's first bad record starts and what is
// wrong with it, or "" when every record reads back. last says whether it
// is the stream's last block, whose end may hold an interrupted append.
func (sc streamCheck) checkBlock(file string, index uint32, last bool) (int64, string, error) {
	buf, err := os.ReadFile(file)
	if err != nil {
		return 0, "", err
	}
	if len(buf) == 0 {
		return 0, "", nil
	}
	if sc.storeKey != "" {
		stream, problem, err := sc.blockCipher(index)
		if err != nil || problem != "" {
			return 0, problem, err
		}
		if stream != nil {
			stream.XORKeyStream(buf, buf)
		}
	}
	// A compressed block (a stream with compression: none of the store's
	// own) carries a header and S2 below it, as filestore's decode reads.
	var meta server.CompressionInfo
	if n, err := meta.UnmarshalMetadata(buf); err != nil || n > 0 {
		if err == nil {
			buf, err = meta.Algorithm.Decompress(buf[n:])
		}
		if err != nil {
			return 0, "a compressed block that does not decompress", nil
		}
	}
	key := sha256.Sum256([]byte(fmt.Sprintf("%s-%d", sc.stream, index)))
	hh, err := highwayhash.New64(key[:])
	if err != nil {
		return 0, "", err
	}
	w := walkRecords(buf, hh)
	switch {
	case w.problem == "":
		return 0, "", nil
	case !w.partial || !last:
		return int64(w.offset), w.problem, nil
	}
	// A partial record ends the stream: an interrupted append, unless the
	// stream's index (written after the data, from what was synced) knew
	// of messages past it, which is what a truncated file looks like.
	if known, ok := sc.indexLastSeq(); ok && known > w.lastSeq {
		return int64(w.offset), fmt.Sprintf("%s, and the stream's index.db knew messages up to sequence %d (the block's end at %d)", w.problem, known, w.lastSeq), nil
	}
	return 0, "", nil
}

// recordWalk is what walkRecords found in a block.
type recordWalk struct {
	// offset is where the first bad record starts, problem what is wrong
	// with it ("" when none is); partial says it is a record (or header)
	// cut short by the end of the file.
	offset  int
	problem string
	partial bool
	// lastSeq is the highest sequence of the good records before it.
	lastSeq uint64
}

// walkRecords walks the records of a decrypted block.
func walkRecords(buf []byte, hh hash.Hash64) recordWalk {
	le := binary.LittleEndian
	var w recordWalk
	for index := 0; index < len(buf); {
		w.offset = index
		rest := len(buf) - index
		if rest < blkRecordHeader {
			w.problem, w.partial = fmt.Sprintf("truncated: %d bytes where a record starts", rest), true
			return w
		}
		hdr := buf[index : index+blkRecordHeader]
		rl, slen := le.Uint32(hdr[0:]), int(le.Uint16(hdr[20:]))
		hasHeaders := rl&blkHeadersBit != 0
		rl &^= blkHeadersBit
		shlen := slen
		if hasHeaders {
			shlen += 4
		}
		dlen := int(rl) - blkRecordHeader
		if dlen < 0 || shlen > dlen-blkRecordHash || rl > blkMaxRecord {
			w.problem = "a record that does not parse (its header is damaged)"
			return w
		}
		if int(rl) > rest {
			w.problem, w.partial = fmt.Sprintf("truncated: a record of %d bytes with %d left", rl, rest), true
			return w
		}
		data := buf[index+blkRecordHeader : index+int(rl)]
		hh.Reset()
		hh.Write(hdr[4:20])
		hh.Write(data[:slen])
		if hasHeaders {
			hh.Write(data[slen+4 : dlen-blkRecordHash])
		} else {
			hh.Write(data[slen : dlen-blkRecordHash])
		}
		var sum [highwayhash.Size64]byte
		if !hmac.Equal(hh.Sum(sum[:0]), data[dlen-blkRecordHash:]) {
			w.problem = "a record whose checksum does not match"
			return w
		}
		// Erased messages and tombstones carry their sequence too.
		if seq := le.Uint64(hdr[4:]) &^ blkSeqFlags; seq > w.lastSeq {
			w.lastSeq = seq
		}
		index += int(rl)
	}
	return recordWalk{lastSeq: w.lastSeq}
}

// blockCipher returns the stream cipher block index is encrypted with:
// its key file (N.key) holds the block's seed sealed under a key derived
// from the store key, the account, the stream and the index. A block
// without a key file is plaintext (the server encrypts it as it starts).
func (sc streamCheck) blockCipher(index uint32) (cipher.Stream, string, error) {
	ekey, err := os.ReadFile(filepath.Join(sc.dir, "msgs", fmt.Sprintf("%d.key", index)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	kek, err := chacha20poly1305.NewX(sc.derive(fmt.Sprintf("%s:%d", sc.stream, index)))
	if err != nil {
		return nil, "", err
	}
	ns := kek.NonceSize()
	if len(ekey) < ns+chacha20poly1305.Overhead {
		return nil, fmt.Sprintf("its key file %d.key is truncated", index), nil
	}
	seed, err := kek.Open(nil, ekey[:ns], ekey[ns:], nil)
	if err != nil {
		return nil, fmt.Sprintf("its key file %d.key does not open with the store key", index), nil
	}
	stream, err := chacha20.NewUnauthenticatedCipher(seed, ekey[:ns])
	return stream, "", err
}

// derive is nats-server's key derivation for a stream's files: HMAC-SHA256
// under the store key of the account and the file's context.
func (sc streamCheck) derive(context string) []byte {
	h := hmac.New(sha256.New, []byte(sc.storeKey))
	h.Write([]byte(sc.account))
	h.Write([]byte(context))
	return h.Sum(nil)
}

// replicas reads the stream's replica count from its meta file (sealed
// under a key in meta.key when the store is encrypted); 0 when it cannot.
func (sc streamCheck) replicas() int {
	buf, err := os.ReadFile(filepath.Join(sc.dir, "meta.inf"))
	if err != nil {
		return 0
	}
	aek, err := sc.streamKey()
	if err != nil {
		return 0
	}
	if buf, err = open(aek, buf); err != nil {
		return 0
	}
	var cfg struct {
		Replicas int `json:"num_replicas"`
	}
	if json.Unmarshal(buf, &cfg) != nil {
		return 0
	}
	return cfg.Replicas
}

// streamKey is the AEAD the stream's meta file and index.db are sealed
// with: its seed is in meta.key, sealed under a key derived from the
// store key. nil when the store is not encrypted.
func (sc streamCheck) streamKey() (cipher.AEAD, error) {
	if sc.storeKey == "" {
		return nil, nil
	}
	ekey, err := os.ReadFile(filepath.Join(sc.dir, "meta.key"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // plaintext, encrypted by the server as it starts
	}
	if err != nil {
		return nil, err
	}
	kek, err := chacha20poly1305.NewX(sc.derive(sc.stream))
	if err != nil {
		return nil, err
	}
	ns := kek.NonceSize()
	if len(ekey) < ns {
		return nil, errors.New("meta.key too short")
	}
	seed, err := kek.Open(nil, ekey[:ns], ekey[ns:], nil)
	if err != nil {
		return nil, err
	}
	return chacha20poly1305.NewX(seed)
}

// open unseals buf (nonce first) with aek; buf itself when aek is nil.
func open(aek cipher.AEAD, buf []byte) ([]byte, error) {
	if aek == nil {
		return buf, nil
	}
	ns := aek.NonceSize()
	if len(buf) < ns {
		return nil, errors.New("sealed file too short")
	}
	return aek.Open(nil, buf[:ns], buf[ns:], nil)
}

// indexLastSeq reads the last sequence the stream's index.db (the state
// the server writes from what it stored) records; ok false when there is
// none or it does not read back.
func (sc streamCheck) indexLastSeq() (uint64, bool) {
	buf, err := os.ReadFile(filepath.Join(sc.dir, "msgs", "index.db"))
	if err != nil || len(buf) < 32 {
		return 0, false
	}
	key := sha256.Sum256([]byte(sc.stream))
	hh, err := highwayhash.New64(key[:])
	if err != nil {
		return 0, false
	}
	sum := buf[len(buf)-highwayhash.Size64:]
	buf = buf[:len(buf)-highwayhash.Size64]
	hh.Write(buf)
	if !hmac.Equal(hh.Sum(nil), sum) {
		return 0, false
	}
	aek, err := sc.streamKey()
	if err != nil {
		return 0, false
	}
	if buf, err = open(aek, buf); err != nil || len(buf) < 2 || buf[0] != indexMagic {
		return 0, false
	}
	// After magic and version: msgs, bytes, first sequence, first time,
	// last sequence.
	bi := 2
	var last uint64
	for i := 0; i < 5; i++ {
		var n int
		if i == 3 {
			_, n = binary.Varint(buf[bi:])
		} else {
			last, n = binary.Uvarint(buf[bi:])
		}
		if n <= 0 {
			return 0, false
		}
		bi += n
	}
	return last, true
}
