package projection

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// A store can go back in time: a storage node restarted from an older copy
// of its directory (a restored backup, an operator's mistake) or one that
// lost writes it had not synced (a power cut). Its routing stream is then
// the same stream (same creation time) but ends before what this gateway
// applied, and the next deploy stores NEW events under sequence numbers the
// gateway already applied. Following on from its position would skip them
// as already seen and keep serving the rewound-away revision; so after
// every reconnect the session proves the stream is still the one it
// followed: same identity, a head at or past the applied sequence, and the
// very message it applied last still stored at that sequence (same subject,
// same bytes). Anything else is a rewind: the projection rebuilds from the
// store, which is the truth, whatever it holds.
//
// What this cannot see: a rewound stream whose new events went past the
// applied sequence and then replaced, per subject, the message stored at
// it (RoutingHistory later events of that one subject, all within the
// reconnect) before the gateway reconnected. The message is then simply
// gone, as it is after an ordinary catch-up across replaced events, which
// must not rebuild.

// errRewound is a routing stream that is not the continuation of what the
// projection applied: recreated, or gone back in time. It is an
// errUncertain, so the session ends and the projection rebuilds.
var errRewound = errors.New("the routing stream went back in time")

func rewound(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", errUncertain, errRewound, fmt.Sprintf(format, args...))
}

// appliedMark is the routing message the view's sequence stands for: the
// last one applied, or the stream's last at a load. known is unset when
// there is none (an empty stream) or it could not be read.
type appliedMark struct {
	seq     uint64
	subject string
	digest  [sha256.Size]byte
	known   bool
}

func markOf(seq uint64, subject string, data []byte) appliedMark {
	return appliedMark{seq: seq, subject: subject, digest: sha256.Sum256(data), known: true}
}

// markStreamHead reads the message at seq, the head a load saw, so that a
// reconnect can tell the same message from a new one stored at seq after a
// rewind. Failing to read it leaves the mark unknown: the next reconnect
// then checks identity and head only.
func (p *Projection) markStreamHead(ctx context.Context, st *store.Store, seq uint64) {
	p.mark = appliedMark{seq: seq}
	if seq == 0 {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := st.RoutingMsg(mctx, seq)
	if err != nil {
		p.log.Debug("reading the routing message the load ends at", zap.Uint64("seq", seq), zap.Error(err))
		return
	}
	p.mark = markOf(seq, m.Subject, m.Data)
}

// checkMark says whether the message the view's sequence stands for is
// still stored there: a different one is a rewind (errRewound). A message
// no longer stored there was replaced by a later one of its subject, which
// the catch-up reads: no rewind.
func (p *Projection) checkMark(ctx context.Context, st *store.Store) error {
	mk := p.mark
	if !mk.known || mk.seq != p.View().Seq {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	m, err := st.RoutingMsg(mctx, mk.seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return store.Classify(fmt.Errorf("reading routing event %d: %w", mk.seq, err))
	case m.Subject != mk.subject || sha256.Sum256(m.Data) != mk.digest:
		return rewound("the routing event at sequence %d is not the one this gateway applied there (%s, applied %s)", mk.seq, m.Subject, mk.subject)
	}
	return nil
}

// noteRewind says loudly that the store went back in time and counts it.
func (p *Projection) noteRewind(err error) {
	p.rewinds.Add(1)
	p.rewindNoted = true
	p.log.Error("the store's routing stream went back in time (restored from an older copy, or it lost writes in a power cut); "+
		"rebuilding from what the store holds now, and serving that", zap.Uint64("applied_seq", p.View().Seq), zap.Error(err))
}
