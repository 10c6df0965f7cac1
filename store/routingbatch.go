package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/edgeplane/edgeplane/signing"
)

// A routing batch carries one namespace's routing of a commit or a canary
// step: every service of the namespace (an upsert each, and a removal for
// each service the commit dropped) as a few messages instead of one per
// service. Its parts are filed on RoutingBatchSubject(ns, 0..n-1), each
// signed for its sequence like any routing event, and a seal right before
// them covers them all (seal.go), so a follower verifies one signature per
// batch and a digest per part.
//
// What the batch, its namespace and the part count are is in the signed
// body, not in headers: a header is not covered by the signature, and a
// reader acts on the count (what a complete batch is). The batch ID is
// the publisher's message ID and a digest of the batch's events, so every
// part of a batch comes from one encoding of one derivation: a retry that
// derived the events again (new timestamps, endpoints) is another batch,
// never parts of two derivations under one ID.
//
// Because a batch holds every service of its namespace, the newest
// complete batch of a namespace is authoritative for it as of its first
// part's sequence: LoadRouting keeps a service only if that batch or a
// later event of its own subject has it. A newest batch that is not
// complete (a publish cut off halfway: the publisher's retry would
// complete it with the same message IDs, a crash would leave it) applies
// as upserts and removals over the newest complete one, which LoadRouting
// then reads from the stream's history (RoutingHistory per part subject);
// a service is never dropped for being in a part that did not land.

// BatchPartsHeader names, on each part, its batch's part count: a hint for
// a reader to wait for the rest before applying (one view swap for the
// batch), never trusted for anything else (the signed body says it).
const BatchPartsHeader = "Edgeplane-Batch-Parts"

// BatchPartBytes bounds the encoded events one part carries: far below the
// routing stream's largest message (4 MiB; the storage node's max_payload
// is 8 MiB), so a part and its republished copy's headers always fit, and
// small enough that a reader decodes a large batch's parts on every core.
const BatchPartBytes = 256 << 10

// MaxBatchParts bounds a batch's parts: one seal covers them all when no
// other appender cuts in (512,000 services of ten instances).
const MaxBatchParts = SealMax

// RoutingBatchPart is the body of one part of a routing batch.
type RoutingBatchPart struct {
	Version int `json:"version"`
	// Batch names the batch: every part of it carries the same ID.
	Batch     string `json:"batch"`
	Namespace string `json:"namespace"`
	// Part is this part's index (its subject's last token), of Parts.
	Part   int            `json:"part"`
	Parts  int            `json:"parts"`
	Events []RoutingEvent `json:"events"`
}

func (r *RoutingBatchPart) version() int { return r.Version }

// IsBatchPart says whether m, a message of the routing stream, is a part
// of a routing batch.
func (s *Store) IsBatchPart(m *StoredMsg) bool {
	_, _, ok := s.Names.RoutingBatchOf(m.Subject)
	return ok
}

// PublishRoutingBatch appends events, every routing event of namespace ns
// that a commit or canary step implies (service upserts and removals of
// ns only), as one sealed routing batch, and returns the sequence of its
// last part. msgID makes a retried publish of the same events idempotent.
// Readers before GenerationBatches cannot read a batch: the control plane
// publishes one only when none is live (control/routing).
func (s *Store) PublishRoutingBatch(ctx context.Context, msgID, ns string, events []RoutingEvent) (uint64, error) {
	key := s.signerKey()
	if key == nil {
		return 0, errSigningKeyRequired()
	}
	msgs, partOf, err := s.encodeBatch(msgID, ns, events)
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	seqs, done, err := s.publishRoutingMsgs(ctx, key, msgs)
	var last uint64
	for i := range events {
		if p := partOf[i]; p < done {
			events[i].Seq = seqs[p]
			last = max(last, seqs[p])
		}
	}
	if err != nil {
		return last, classify(fmt.Errorf("publishing part %d of %d of the routing batch of %s: %w", done, len(msgs), ns, err))
	}
	return last, nil
}

// SignRoutingBatch returns what PublishRoutingBatch appends for events of
// namespace ns right after sequence last, signed by k and sealed. It is for
// whoever publishes them itself (benchmarks timing the readers' side).
func (s *Store) SignRoutingBatch(k *signing.Key, last uint64, ns string, events []RoutingEvent) ([]*nats.Msg, error) {
	rms, _, err := s.encodeBatch("", ns, events)
	if err != nil {
		return nil, err
	}
	msgs, _, err := s.sealedMsgs(k, last, rms)
	return msgs, err
}

// encodeBatch encodes events as the parts of one batch of namespace ns;
// partOf[i] is the part events[i] is in.
func (s *Store) encodeBatch(msgID, ns string, events []RoutingEvent) (msgs []routingMsg, partOf []int, err error) {
	if !ValidToken(ns) {
		return nil, nil, fmt.Errorf("publishing a routing batch: invalid namespace %q", ns)
	}
	encoded := make([][]byte, len(events))
	h := sha256.New()
	for i := range events {
		ev := &events[i]
		if (ev.Kind != EventServiceUpsert && ev.Kind != EventServiceRemove) || ev.Namespace != ns || !ValidToken(ev.Service) {
			return nil, nil, fmt.Errorf("publishing the routing batch of %s: it holds the namespace's service events only, not %s %s", ns, ev.Kind, ev.Identity())
		}
		ev.Version = RecordVersion
		if encoded[i], err = json.Marshal(ev); err != nil {
			return nil, nil, fmt.Errorf("encoding routing event %s: %w", ev.Identity(), err)
		}
		h.Write(encoded[i])
	}
	// Parts split by size: a part starts where the one before it would
	// outgrow BatchPartBytes.
	var starts []int
	size := 0
	for i, d := range encoded {
		if i == 0 || size+len(d)+1 > BatchPartBytes {
			starts = append(starts, i)
			size = 0
		}
		size += len(d) + 1
	}
	n := len(starts)
	if n > MaxBatchParts {
		return nil, nil, fmt.Errorf("publishing the routing batch of %s: %d parts, more than %d", ns, n, MaxBatchParts)
	}
	batch := cmp.Or(msgID, nuid.Next()) + "." + hex.EncodeToString(h.Sum(nil)[:6])
	msgs, partOf = make([]routingMsg, n), make([]int, len(events))
	for p, lo := range starts {
		hi := len(encoded)
		if p+1 < n {
			hi = starts[p+1]
		}
		head, err := json.Marshal(&RoutingBatchPart{Version: RecordVersion, Batch: batch, Namespace: ns, Part: p, Parts: n})
		if err != nil {
			return nil, nil, fmt.Errorf("encoding part %d of the routing batch of %s: %w", p, ns, err)
		}
		// The events are spliced in as encoded once above: the head's
		// "events":null is cut off, the array put in its place.
		head = head[:len(head)-len(`,"events":null}`)]
		buf := make([]byte, 0, len(head)+BatchPartBytes/8)
		buf = append(append(buf, head...), `,"events":[`...)
		for i := lo; i < hi; i++ {
			if i > lo {
				buf = append(buf, ',')
			}
			buf = append(buf, encoded[i]...)
			partOf[i] = p
		}
		buf = append(buf, "]}"...)
		msgs[p] = routingMsg{subject: s.Names.RoutingBatchSubject(ns, p), data: buf, id: fmt.Sprintf("%s.%d", batch, p), parts: n}
	}
	return msgs, partOf, nil
}

// decodePart decodes m, a batch part whose signature (or seal) was
// verified, and checks that it is what its subject says: a part of its
// namespace at its index, and every event in it an event of a service of
// that namespace. A reader never trusts a record's body over its subject:
// a part that fails any of it is refused whole.
func (s *Store) decodePart(m *StoredMsg) (*RoutingBatchPart, error) {
	invalid := func(format string, args ...any) error {
		return &Error{Code: CodeInvalid, Message: fmt.Sprintf("routing batch part %d on %s: ", m.Seq, m.Subject) + fmt.Sprintf(format, args...)}
	}
	ns, idx, ok := s.Names.RoutingBatchOf(m.Subject)
	if !ok {
		return nil, invalid("not a batch part's subject")
	}
	var p RoutingBatchPart
	if err := Decode("routing batch part", m.Data, &p); err != nil {
		return nil, invalid("%v", err)
	}
	switch {
	case p.Namespace != ns:
		return nil, invalid("a part of namespace %q filed on %s's", p.Namespace, ns)
	case p.Part != idx:
		return nil, invalid("part %d filed as part %d", p.Part, idx)
	case p.Parts < 1 || p.Parts > MaxBatchParts || p.Part >= p.Parts:
		return nil, invalid("part %d of %d", p.Part, p.Parts)
	case p.Batch == "":
		return nil, invalid("no batch ID")
	case len(p.Events) == 0:
		return nil, invalid("no events")
	}
	for i := range p.Events {
		ev := &p.Events[i]
		if err := checkVersion("routing event", ev.Version); err != nil {
			return nil, invalid("event %d: %v", i, err)
		}
		if (ev.Kind != EventServiceUpsert && ev.Kind != EventServiceRemove) || ev.Namespace != ns || !ValidToken(ev.Service) {
			return nil, invalid("event %d, %s %s, is not an event of a service of %s", i, ev.Kind, ev.Identity(), ns)
		}
		ev.Seq = m.Seq
	}
	return &p, nil
}

// partAt is a verified batch part and its sequence.
type partAt struct {
	seq  uint64
	part *RoutingBatchPart
}

// batchParts are the parts of one batch a reader found.
type batchParts struct {
	parts      map[int]partAt
	n          int
	consistent bool // every part names the same count
	first      uint64
	last       uint64
}

func (b *batchParts) complete() bool { return b.consistent && len(b.parts) == b.n }

// groupBatches groups parts by batch.
func groupBatches(parts []partAt) map[string]*batchParts {
	out := map[string]*batchParts{}
	for _, pa := range parts {
		b := out[pa.part.Batch]
		if b == nil {
			b = &batchParts{parts: map[int]partAt{}, n: pa.part.Parts, consistent: true, first: pa.seq}
			out[pa.part.Batch] = b
		}
		b.consistent = b.consistent && b.n == pa.part.Parts
		b.parts[pa.part.Part] = pa
		b.first, b.last = min(b.first, pa.seq), max(b.last, pa.seq)
	}
	return out
}

// newestComplete is the complete batch with the latest part, nil if none.
func newestComplete(batches map[string]*batchParts) *batchParts {
	var best *batchParts
	for _, b := range batches {
		if b.complete() && (best == nil || b.last > best.last) {
			best = b
		}
	}
	return best
}

// namespaceBatches resolves what namespace ns's batches say as of sequence
// upTo, from lasts, the verified last part of each of its part subjects:
// the events to weigh against the services' own subjects (each with its
// part's sequence), and from, the first sequence of the newest complete
// batch (0 when none is found): a service with no event at or after from
// is gone. A suspect namespace (one of its last parts was refused) is
// read from its batches' history, as one whose newest batch is not whole.
// skip notes why a part read from history could not be used.
func (s *Store) namespaceBatches(ctx context.Context, ns string, upTo uint64, lasts []partAt, suspect bool, skip func(string)) (events []RoutingEvent, from uint64, err error) {
	take := func(parts map[int]partAt, after uint64) {
		for _, pa := range parts {
			if pa.seq > after {
				events = append(events, pa.part.Events...)
			}
		}
	}
	var newest *batchParts
	for _, b := range groupBatches(lasts) {
		if newest == nil || b.last > newest.last {
			newest = b
		}
	}
	if b := newest; !suspect && b != nil && b.complete() {
		// The common case: the last part of each subject below n is the
		// newest batch's; parts on subjects from n on are older batches'.
		take(b.parts, 0)
		return events, b.first, nil
	}
	// The newest batch is not whole (or one of its parts was refused):
	// find the newest complete one in the
	// few parts each subject keeps, and lay what came after it over it.
	var hist []*StoredMsg
	if _, err := s.ReadFrom(ctx, s.Names.RoutingEventsStream(), 1, s.Names.RoutingBatchWildcard(ns), func(m *StoredMsg) error {
		if m.Seq <= upTo {
			hist = append(hist, m)
		}
		return nil
	}); err != nil {
		return nil, 0, fmt.Errorf("reading the routing batches of %s: %w", ns, err)
	}
	var none *Seal
	_, parts, errs := s.VerifyRouting(ctx, hist, &none)
	var all []partAt
	for i, m := range hist {
		if errs[i] != nil {
			skip(errs[i].Error())
			continue
		}
		all = append(all, partAt{seq: m.Seq, part: parts[i]})
	}
	batches := groupBatches(all)
	c := newestComplete(batches)
	if c == nil {
		// No complete batch left to stand on: every last part is laid
		// over the services' own subjects as upserts and removals.
		for _, pa := range lasts {
			events = append(events, pa.part.Events...)
		}
		return events, 0, nil
	}
	take(c.parts, 0)
	for _, b := range batches {
		if b != c {
			take(b.parts, c.last)
		}
	}
	return events, c.first, nil
}
