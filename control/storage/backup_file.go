package storage

// The backup file: a fixed preamble, then the content in segments.
//
//	preamble  "EPBACKUP" | format uint16 | cipher uint8 | 0 | salt [32]byte |
//	          key check [16]byte
//	segment   length uint32 (top bit: the last segment) | payload
//	content   header length uint32 | header JSON | SHA-256 of the header JSON |
//	          each stream's snapshot, in the header's order
//
// The header, and each stream's snapshot, begin a segment of their own, so
// a segment that fails to open names the stream it belongs to. The key
// check (derived from the store key and the salt, as the AEAD key is, with
// another label) tells a wrong key from a damaged file.
//
// With cipherAESGCM every payload is sealed with AES-256-GCM under a key
// derived from the store key and the salt (HKDF-SHA256), the segment's
// number and the last-segment flag in its nonce and the preamble as
// additional data: a changed byte, a reordered, dropped or appended segment
// or a cut file fails to open. Without a cipher the same framing holds the
// content in the clear and the header's SHA-256 sums (the header's own,
// then each stream's) find a changed byte; the last-segment flag and the
// sizes find a cut file.

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	backupMagic   = "EPBACKUP"
	backupFormat  = 1
	preambleSize  = 8 + 2 + 1 + 1 + 32 + 16
	segmentSize   = 1 << 20
	lastSegment   = 1 << 31
	maxHeaderSize = 64 << 20
)

// Ciphers a backup's content is sealed with.
const (
	cipherNone   = 0
	cipherAESGCM = 1
)

// errTruncated is a file that ends before its content does.
var errTruncated = errors.New("truncated")

// preamble is a backup file's first bytes.
type preamble struct {
	format   uint16
	cipher   uint8
	salt     [32]byte
	keyCheck [16]byte
}

func (p preamble) bytes() []byte {
	b := make([]byte, 0, preambleSize)
	b = append(b, backupMagic...)
	b = binary.BigEndian.AppendUint16(b, p.format)
	b = append(b, p.cipher, 0)
	b = append(b, p.salt[:]...)
	return append(b, p.keyCheck[:]...)
}

func readPreamble(r io.Reader) (preamble, error) {
	var p preamble
	b := make([]byte, preambleSize)
	if _, err := io.ReadFull(r, b); err != nil {
		return p, fmt.Errorf("the file ends within its preamble: %w", errTruncated)
	}
	if string(b[:8]) != backupMagic {
		return p, errors.New("not an edgeplane backup (no EPBACKUP preamble)")
	}
	p.format = binary.BigEndian.Uint16(b[8:10])
	p.cipher = b[10]
	copy(p.salt[:], b[12:44])
	copy(p.keyCheck[:], b[44:])
	if p.format != backupFormat {
		return p, fmt.Errorf("backup format %d: this control reads format %d", p.format, backupFormat)
	}
	if p.cipher != cipherNone && p.cipher != cipherAESGCM {
		return p, fmt.Errorf("unknown cipher %d in the preamble", p.cipher)
	}
	return p, nil
}

// backupAEAD is the AEAD a backup with salt is sealed with under storeKey,
// and the key check its preamble holds. The key is derived, not the store
// key itself: nats-server encrypts the store with the store key, and one
// key serves one purpose.
func backupAEAD(storeKey string, salt []byte) (cipher.AEAD, [16]byte, error) {
	var check [16]byte
	key, err := hkdf.Key(sha256.New, []byte(storeKey), salt, "edgeplane backup v1", 32)
	if err != nil {
		return nil, check, err
	}
	c, err := hkdf.Key(sha256.New, []byte(storeKey), salt, "edgeplane backup v1 key check", len(check))
	if err != nil {
		return nil, check, err
	}
	copy(check[:], c)
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, check, err
	}
	a, err := cipher.NewGCM(block)
	return a, check, err
}

// sealedPreamble is a new sealed backup's preamble, and its AEAD.
func sealedPreamble(storeKey string) (preamble, cipher.AEAD, error) {
	p := preamble{format: backupFormat, cipher: cipherAESGCM, salt: newSalt()}
	a, check, err := backupAEAD(storeKey, p.salt[:])
	p.keyCheck = check
	return p, a, err
}

// openPreamble is the AEAD a sealed backup with preamble p opens with
// under storeKey, refused when the key check says it is another key.
func openPreamble(p preamble, storeKey string) (cipher.AEAD, error) {
	a, check, err := backupAEAD(storeKey, p.salt[:])
	if err != nil {
		return nil, err
	}
	if check != p.keyCheck {
		return nil, errors.New("not the store key this backup was sealed with (or its preamble is corrupt)")
	}
	return a, nil
}

// segmentNonce makes segment n's nonce: n, and whether it is the last, so
// that no segment can be moved, and the file cannot be cut at a segment.
func segmentNonce(n uint64, last bool) []byte {
	nonce := make([]byte, 12)
	binary.BigEndian.PutUint64(nonce, n)
	if last {
		nonce[11] = 1
	}
	return nonce
}

// segmentWriter frames what is written to it into segments, sealed when
// aead is set. Close writes the last segment; without it the file reads
// as truncated.
type segmentWriter struct {
	w    *bufio.Writer
	aead cipher.AEAD
	ad   []byte
	buf  []byte
	n    uint64
}

func newSegmentWriter(w io.Writer, p preamble, aead cipher.AEAD) (*segmentWriter, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	ad := p.bytes()
	if _, err := bw.Write(ad); err != nil {
		return nil, err
	}
	return &segmentWriter{w: bw, aead: aead, ad: ad, buf: make([]byte, 0, segmentSize)}, nil
}

func (s *segmentWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		k := min(len(b), segmentSize-len(s.buf))
		s.buf = append(s.buf, b[:k]...)
		b = b[k:]
		if len(s.buf) == segmentSize {
			if err := s.flush(false); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (s *segmentWriter) flush(last bool) error {
	payload := s.buf
	if s.aead != nil {
		payload = s.aead.Seal(nil, segmentNonce(s.n, last), s.buf, s.ad)
	}
	l := uint32(len(payload))
	if last {
		l |= lastSegment
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], l)
	if _, err := s.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(payload); err != nil {
		return err
	}
	s.n++
	s.buf = s.buf[:0]
	return nil
}

// Boundary ends the segment under way (if any): what is written next
// begins a segment of its own.
func (s *segmentWriter) Boundary() error {
	if len(s.buf) == 0 {
		return nil
	}
	return s.flush(false)
}

// Close writes what is buffered as the last segment and flushes.
func (s *segmentWriter) Close() error {
	if err := s.flush(true); err != nil {
		return err
	}
	return s.w.Flush()
}

// segmentReader reads back what a segmentWriter wrote, opening each
// segment as it comes: what it returns was authenticated (sealed) or at
// least framed as written. Off is where in the file the segment being
// read began, for errors that say where the damage is.
type segmentReader struct {
	r    *bufio.Reader
	aead cipher.AEAD
	ad   []byte
	cur  []byte
	n    uint64
	off  int64
	last bool
}

func newSegmentReader(r io.Reader, p preamble, aead cipher.AEAD) *segmentReader {
	return &segmentReader{r: bufio.NewReaderSize(r, 256<<10), aead: aead, ad: p.bytes(), off: preambleSize}
}

func (s *segmentReader) Read(b []byte) (int, error) {
	for len(s.cur) == 0 {
		if s.last {
			return 0, io.EOF
		}
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	n := copy(b, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}

func (s *segmentReader) next() error {
	var hdr [4]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return fmt.Errorf("the file ends at byte %d, before its last segment: %w", s.off, errTruncated)
	}
	l := binary.BigEndian.Uint32(hdr[:])
	last := l&lastSegment != 0
	l &^= lastSegment
	limit := segmentSize
	if s.aead != nil {
		limit += s.aead.Overhead()
	}
	if int(l) > limit {
		return fmt.Errorf("segment %d at byte %d: length %d is more than a segment holds: the file is corrupt", s.n, s.off, l)
	}
	payload := make([]byte, l)
	if _, err := io.ReadFull(s.r, payload); err != nil {
		return fmt.Errorf("segment %d at byte %d: its %d bytes run past the end of the file (or its length is corrupt): %w", s.n, s.off, l, errTruncated)
	}
	if s.aead != nil {
		var err error
		if payload, err = s.aead.Open(payload[:0], segmentNonce(s.n, last), payload, s.ad); err != nil {
			return fmt.Errorf("segment %d at byte %d does not open: the file is corrupt (changed, reordered or cut)", s.n, s.off)
		}
	}
	s.off += 4 + int64(l)
	s.cur, s.last = payload, last
	s.n++
	if last {
		// Nothing may follow the last segment.
		if _, err := s.r.ReadByte(); err == nil {
			return fmt.Errorf("bytes follow the last segment at byte %d: the file is corrupt", s.off)
		}
	}
	return nil
}

// newSalt is a fresh salt for a sealed backup.
func newSalt() (s [32]byte) {
	_, _ = rand.Read(s[:])
	return s
}
