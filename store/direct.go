package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading without consumers. Untrusted roles may create no JetStream
// consumer at all: a push consumer delivers wherever its creator says,
// including into a stream its creator may not publish to. They read with
// JetStream's direct get instead, whose answers go back to the asker, and
// follow changes through what streams republish once a message is stored.
// Every part reads this way, trusted or not, so that there is one way to
// read.

// EdgeAPIPrefix is where a client of the edge account (agents, meshd,
// gateways) reaches the JetStream API of the account that holds the store:
// the subjects the edge account imports.
const EdgeAPIPrefix = "$JS.cp.API"

// apiPrefixOf is the JetStream API prefix of a connection: EdgeAPIPrefix
// for credentials of an untrusted role (their JWT's role tag says so), the
// default otherwise. A connection of Connect has its credentials decoded
// already (its holder's); only another's JWT is decoded here.
func apiPrefixOf(nc *nats.Conn) string {
	if h := holderOf(nc); h != nil {
		if h.edge() {
			return EdgeAPIPrefix + "."
		}
		return jetstream.DefaultAPIPrefix
	}
	if nc.Opts.UserJWT == nil {
		return jetstream.DefaultAPIPrefix
	}
	tok, err := nc.Opts.UserJWT()
	if err != nil {
		return jetstream.DefaultAPIPrefix
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return jetstream.DefaultAPIPrefix
	}
	for _, tag := range uc.Tags {
		if role, ok := strings.CutPrefix(tag, "role:"); ok && role != "control" {
			return EdgeAPIPrefix + "."
		}
	}
	return jetstream.DefaultAPIPrefix
}

// directRequest is JetStream's direct get request (a batch of messages
// from a sequence, optionally of a subject filter, or the last message of
// each of several subjects).
type directRequest struct {
	Seq       uint64   `json:"seq,omitempty"`
	NextFor   string   `json:"next_by_subj,omitempty"`
	Batch     int      `json:"batch,omitempty"`
	MultiLast []string `json:"multi_last,omitempty"`
	UpToSeq   uint64   `json:"up_to_seq,omitempty"`
}

// StoredMsg is a message as a stream stored it, read by direct get or
// received as the stream republished it.
type StoredMsg struct {
	Subject string
	Seq     uint64
	Time    time.Time
	Header  nats.Header
	Data    []byte
	// Pending is how many messages matching the request followed this one
	// when it was read (batched reads only).
	Pending uint64
	// Prev is the stream's last sequence before this message was stored
	// (republished messages only; 0 otherwise).
	Prev uint64
}

// StoredFromMsg reads a message a stream republished, or a direct get
// answer: the stream's headers name its subject and sequence.
func StoredFromMsg(m *nats.Msg) (*StoredMsg, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("stored message without a sequence header (%q)", m.Header.Get(jetstream.SequenceHeader))
	}
	sm := &StoredMsg{Subject: m.Header.Get(jetstream.SubjectHeader), Seq: seq, Header: m.Header, Data: m.Data}
	sm.Time, _ = time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer)) // sic: nats.go's name
	if p := m.Header.Get("Nats-Num-Pending"); p != "" {
		sm.Pending, _ = strconv.ParseUint(p, 10, 64)
	}
	if p := m.Header.Get("Nats-Last-Sequence"); p != "" {
		sm.Prev, _ = strconv.ParseUint(p, 10, 64)
	}
	return sm, nil
}

// directBatchSize is how many messages one direct get asks for.
const directBatchSize = 1000

// directTimeout bounds a wait for the next message of a direct answer when
// ctx has no earlier deadline.
const directTimeout = 5 * time.Second

// direct sends one direct get request to stream and hands every message of
// the answer to fn. It returns the number of matching messages left after
// the answer (0 when the read reached the end). An answer that fails before
// its first message (the replicas that answer direct gets are catching up
// after a storage node died, say) is asked again while that is an
// election's symptom; one cut short after it is not, since fn has seen
// part of it.
func (s *Store) direct(ctx context.Context, stream string, req directRequest, fn func(*StoredMsg) error) (pending uint64, err error) {
	var partial error
	err = s.ride(ctx, "reading "+stream, func(ctx context.Context, _ bool) error {
		delivered := false
		var err error
		pending, err = s.directOnce(ctx, stream, req, func(m *StoredMsg) error {
			delivered = true
			return fn(m)
		})
		if err != nil && delivered {
			partial = err
			return nil
		}
		return err
	})
	if partial != nil {
		err = partial
	}
	return pending, classify(err)
}

// directOnce is one attempt of direct.
func (s *Store) directOnce(ctx context.Context, stream string, req directRequest, fn func(*StoredMsg) error) (pending uint64, err error) {
	data, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	inbox := s.NC.NewInbox()
	sub, err := s.NC.SubscribeSync(inbox)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.NC.PublishRequest(s.apiPrefix+"DIRECT.GET."+stream, inbox, data); err != nil {
		return 0, fmt.Errorf("reading %s: %w", stream, err)
	}
	for {
		m, err := nextMsg(ctx, sub)
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", stream, err)
		}
		sm, status, err := directReply(stream, m)
		switch {
		case err != nil:
			return 0, err
		case status == "204": // end of batch
			pending, _ = strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return pending, nil
		case status == "404": // nothing (more) matches
			return 0, nil
		}
		if err := fn(sm); err != nil {
			return 0, err
		}
		if req.Batch == 0 && len(req.MultiLast) == 0 {
			return 0, nil // a single message has no end-of-batch marker
		}
	}
}

// directReply reads one message of a direct get's answer from stream: a
// stored message, or a status ("204" end of batch, "404" nothing
// matches); any other status is an error.
func directReply(stream string, m *nats.Msg) (*StoredMsg, string, error) {
	switch status := m.Header.Get("Status"); status {
	case "":
	case "204", "404":
		return nil, status, nil
	case "503":
		return nil, status, fmt.Errorf("reading %s: %w", stream, nats.ErrNoResponders)
	default:
		return nil, status, fmt.Errorf("reading %s: %s %s", stream, status, m.Header.Get("Description"))
	}
	sm, err := StoredFromMsg(m)
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", stream, err)
	}
	return sm, "", nil
}

// nextMsg waits for sub's next message until ctx ends, or for directTimeout
// when ctx has no deadline.
func nextMsg(ctx context.Context, sub *nats.Subscription) (*nats.Msg, error) {
	if _, ok := ctx.Deadline(); ok {
		return sub.NextMsgWithContext(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, directTimeout)
	defer cancel()
	return sub.NextMsgWithContext(ctx)
}

// ReadFrom hands fn every message of stream from sequence seq on that
// matches filter ("" for all), in order, reading to the end of the stream
// as it grows meanwhile. It returns the sequence after the last message
// read (seq itself if there was none).
func (s *Store) ReadFrom(ctx context.Context, stream string, seq uint64, filter string, fn func(*StoredMsg) error) (uint64, error) {
	next := max(seq, 1)
	for {
		var read int
		pending, err := s.direct(ctx, stream, directRequest{Seq: next, NextFor: filter, Batch: directBatchSize}, func(m *StoredMsg) error {
			read++
			next = m.Seq + 1
			return fn(m)
		})
		if err != nil {
			return next, err
		}
		if read == 0 || pending == 0 {
			return next, nil
		}
	}
}

// LastOf hands fn the last message of each of subjects (concrete or with
// wildcards), all as of one sequence, in batches JetStream accepts.
// Subjects with no message are skipped.
func (s *Store) LastOf(ctx context.Context, stream string, subjects []string, fn func(*StoredMsg) error) error {
	switch len(subjects) {
	case 0:
		return nil
	case 1:
		// One subject is one moment: one direct get, no stream info.
		m, err := s.lastFor(ctx, stream, subjects[0])
		if err != nil || m == nil {
			return err
		}
		return fn(m)
	}
	// One sequence for every batch, so that together they describe one
	// moment of the stream.
	str, err := s.JS.Stream(ctx, stream)
	if err != nil {
		return classify(fmt.Errorf("reading %s: %w", stream, err))
	}
	return s.lastOfUpTo(ctx, stream, subjects, str.CachedInfo().State.LastSeq, fn)
}

// lastFor reads the last message of subject in stream (nil if there is
// none) with a direct get in its subject form, the form credentials can
// allow for one key alone.
func (s *Store) lastFor(ctx context.Context, stream, subject string) (*StoredMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directTimeout)
		defer cancel()
	}
	var found *StoredMsg
	err := s.ride(ctx, "reading "+stream, func(ctx context.Context, _ bool) error {
		m, err := s.NC.RequestWithContext(ctx, s.apiPrefix+"DIRECT.GET."+stream+"."+subject, nil)
		if err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		found, _, err = directReply(stream, m) // "404": found is nil
		return err
	})
	return found, classify(err)
}

// lastOfUpTo is LastOf as of sequence upTo.
func (s *Store) lastOfUpTo(ctx context.Context, stream string, subjects []string, upTo uint64, fn func(*StoredMsg) error) error {
	if upTo == 0 {
		return nil
	}
	for len(subjects) > 0 {
		n := min(len(subjects), multiLastMax)
		if _, err := s.direct(ctx, stream, directRequest{MultiLast: subjects[:n], UpToSeq: upTo, Batch: n}, fn); err != nil {
			return err
		}
		subjects = subjects[n:]
	}
	return nil
}

// multiLastMax is the most subjects JetStream answers in one multi-last
// direct get.
const multiLastMax = 1000

// SubjectsOf lists the subjects of stream that match filter and hold a
// message.
func (s *Store) SubjectsOf(ctx context.Context, stream, filter string) ([]string, error) {
	str, err := s.JS.Stream(ctx, stream)
	if err != nil {
		return nil, classify(fmt.Errorf("reading %s: %w", stream, err))
	}
	info, err := str.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, classify(fmt.Errorf("listing subjects of %s: %w", stream, err))
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		out = append(out, subj)
	}
	sort.Strings(out)
	return out, nil
}

// KVEntry is one live key of a bucket as a scan read it.
type KVEntry struct {
	Key      string
	Value    []byte
	Revision uint64
	Created  time.Time
}

// ScanKV returns every live key of kv matching filter (a key filter such
// as "ns.>") with its latest value, in key order. It reads the bucket's
// stream from its start to its end, however the bucket changes meanwhile:
// a key written during the scan is read again later with its new value, a
// key deleted during it goes.
func (s *Store) ScanKV(ctx context.Context, kv jetstream.KeyValue, filter string) ([]KVEntry, error) {
	bucket := kv.Bucket()
	prefix := "$KV." + bucket + "."
	latest := make(map[string]KVEntry)
	_, err := s.ReadFrom(ctx, "KV_"+bucket, 1, prefix+filter, func(m *StoredMsg) error {
		key := strings.TrimPrefix(m.Subject, prefix)
		switch m.Header.Get("KV-Operation") {
		case "DEL", "PURGE":
			delete(latest, key)
		default:
			latest[key] = KVEntry{Key: key, Value: m.Data, Revision: m.Seq, Created: m.Time}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", bucket, err)
	}
	out := make([]KVEntry, 0, len(latest))
	for _, e := range latest {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
