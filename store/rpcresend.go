package store

import (
	"context"
	"crypto/sha256"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// A request can vanish in the storage node: nats-server rebuilds an
// account's imports and exports whenever its claims change (every
// revocation: a box switching to renewed credentials retires its old key),
// and a request crossing the import in that instant, or an answer whose
// reply mapping it dropped, is lost without a word. So a call is asked again
// under the same call ID until answered, and Serve answers a call ID once:
// an ask of a call being answered waits for that answer, an ask of one
// answered gets the same answer again. Each ask is its own request (its own
// reply mapping, and one answer, as the responders' permissions allow),
// into one inbox.
const (
	// CallIDHeader names a call across the asks of it.
	CallIDHeader = "Edgeplane-Call"
	// CallsOnceHeader, on an answer, says the responder answers each call
	// ID once: its caller may ask again. A responder of an earlier release
	// does not say it, and is never asked twice (it would run the command
	// twice).
	CallsOnceHeader = "Edgeplane-Calls-Once"
)

// askAgainAfter is when a call not answered yet is asked again: soon after the
// first ask (a lost request costs that much), then less often.
var askAgainAfter = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}

// noResponderPauses are the waits before asking again a responder that
// answers once, when the storage node said no one listens.
var noResponderPauses = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 750 * time.Millisecond}

// callsOnce holds the responders (an agent's subject space) that said
// CallsOnceHeader: a machine's agent answers all its commands alike, so
// what the first answer (a deploy's capacity probe) said holds for the
// calls after it.
var callsOnce sync.Map

// callMux takes the answers to a connection's calls on one wildcard
// subscription, as nats.go does for its requests: a subscription per call
// would cost two protocol round trips each.
type callMux struct {
	prefix string
	sub    *nats.Subscription

	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

var callMuxes sync.Map // *nats.Conn → *callMux

var callMuxMu sync.Mutex

func muxOf(nc *nats.Conn) (*callMux, error) {
	if v, ok := callMuxes.Load(nc); ok && v.(*callMux).sub.IsValid() {
		return v.(*callMux), nil
	}
	callMuxMu.Lock()
	defer callMuxMu.Unlock()
	if v, ok := callMuxes.Load(nc); ok && v.(*callMux).sub.IsValid() {
		return v.(*callMux), nil
	}
	x := &callMux{prefix: nc.NewInbox() + ".", waiting: map[string]chan *nats.Msg{}}
	sub, err := nc.Subscribe(x.prefix+"*", func(m *nats.Msg) {
		x.mu.Lock()
		ch := x.waiting[m.Subject[len(x.prefix):]]
		x.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default: // a second answer (to another ask): the first is taken
			}
		}
	})
	if err != nil {
		return nil, err
	}
	x.sub = sub
	callMuxes.Range(func(k, v any) bool {
		if k.(*nats.Conn).IsClosed() {
			callMuxes.Delete(k)
		}
		return true
	})
	callMuxes.Store(nc, x)
	return x, nil
}

// request sends req and waits for its answer until ctx ends. With a
// responder (an agent's subject space), the call goes under a call ID and
// is asked again while not answered, once that responder said it answers
// a call once (see the comment above). Only an agent's RPC is asked again:
// one agent answers a machine's subjects, where the control plane's
// services are queue groups of several servers that do not share what
// they answered.
func request(ctx context.Context, nc *nats.Conn, req *nats.Msg, responder string) (*nats.Msg, error) {
	askAgain := responder != ""
	x, err := muxOf(nc)
	if err != nil {
		return nil, err
	}
	token := nuid.Next()
	answers := make(chan *nats.Msg, 1)
	x.mu.Lock()
	x.waiting[token] = answers
	x.mu.Unlock()
	defer func() {
		x.mu.Lock()
		delete(x.waiting, token)
		x.mu.Unlock()
	}()
	ask := &nats.Msg{Subject: req.Subject, Reply: x.prefix + token, Data: req.Data, Header: nats.Header{}}
	maps.Copy(ask.Header, req.Header)
	if askAgain {
		ask.Header.Set(CallIDHeader, token)
	}
	if err := nc.PublishMsg(ask); err != nil {
		return nil, err
	}
	for asked, quiet := 0, 0; ; {
		var again <-chan time.Time
		var timer *time.Timer
		if askAgain {
			// Also while the responder is not known to answer once: a
			// call made before the first answer said so learns it here.
			timer = time.NewTimer(askAgainAfter[min(asked, len(askAgainAfter)-1)])
			again = timer.C
		}
		var m *nats.Msg
		select {
		case <-ctx.Done():
		case <-again:
		case m = <-answers:
		}
		if timer != nil {
			timer.Stop()
		}
		switch {
		case m != nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			if _, once := callsOnce.Load(responder); once {
				if err := nc.PublishMsg(ask); err != nil {
					return nil, err
				}
				asked++
			}
			continue
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			if _, once := callsOnce.Load(responder); askAgain && once && quiet < len(noResponderPauses) {
				// The storage node also answers "no responders" in the
				// instant it rebuilds the account (see above): a
				// responder known to be there is asked again a few
				// times, and an agent that is gone is said so within
				// about a second.
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(noResponderPauses[quiet]):
				}
				quiet++
				if err := nc.PublishMsg(ask); err != nil {
					return nil, err
				}
				continue
			}
			if asked > 0 {
				// The responder is away for a moment (reconnecting):
				// it had the call, and is asked again in a while.
				continue
			}
			return nil, nats.ErrNoResponders
		}
		if askAgain && m.Header.Get(CallsOnceHeader) != "" {
			callsOnce.Store(responder, true)
		}
		return m, nil
	}
}

// callLog is what a responder remembers of the calls it answers, by call
// ID: whom to answer while it works on one, and the answer for a while
// after.
type callLog struct {
	mu       sync.Mutex
	calls    map[string]*loggedCall
	prunedAt time.Time
}

type waitingAsk struct {
	m  *nats.Msg
	at time.Time
}

type loggedCall struct {
	// sum is of the request: a different request under a known call ID is
	// not an ask of that call.
	sum [32]byte
	// waiting are the asks not answered yet, and when each came.
	waiting []waitingAsk
	// answer, once there is one, and when.
	answer     []byte
	answeredAt time.Time
}

// callMemory is how long an answer is kept for asks that come late: a
// caller asks again within the last of askAgainAfter.
const callMemory = 15 * time.Second

func requestSum(m *nats.Msg) [32]byte {
	h := sha256.New()
	h.Write([]byte(m.Subject))
	h.Write([]byte{0})
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		if k != RequesterHeader {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h.Write([]byte(k))
		for _, v := range m.Header[k] {
			h.Write([]byte{0})
			h.Write([]byte(v))
		}
		h.Write([]byte{1})
	}
	h.Write(m.Data)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// ask records m, an ask of call id, and reports whether the call is
// already in hand (answered again, or to be answered with the others).
func (l *callLog) ask(id string, m *nats.Msg) bool {
	sum := requestSum(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.calls == nil {
		l.calls = map[string]*loggedCall{}
	}
	c, ok := l.calls[id]
	if ok && c.sum == sum {
		if c.answer == nil {
			c.waiting = append(c.waiting, waitingAsk{m, now})
		} else {
			_ = m.RespondMsg(answerMsg(c.answer))
		}
		return true
	}
	if now.Sub(l.prunedAt) > callMemory/4 {
		l.prunedAt = now
		for k, c := range l.calls {
			if c.answer != nil && now.Sub(c.answeredAt) > callMemory {
				delete(l.calls, k)
			}
		}
	}
	l.calls[id] = &loggedCall{sum: sum, waiting: []waitingAsk{{m, now}}}
	return false
}

// answerWithin is how old an ask may be and still be answered: a
// responder's permissions let it answer a request for a minute
// (storagenode's RolePermissions), and a caller waiting longer asked again
// meanwhile.
const answerWithin = 50 * time.Second

// answer sends out to the asks of call id waiting for it (the latest, and
// any the responder may still answer), and keeps it for asks to come.
func (l *callLog) answer(id string, out []byte) {
	l.mu.Lock()
	c := l.calls[id]
	var waiting []waitingAsk
	if c != nil {
		waiting, c.waiting = c.waiting, nil
		c.answer, c.answeredAt = out, time.Now()
	}
	l.mu.Unlock()
	for i, w := range waiting {
		if i == len(waiting)-1 || time.Since(w.at) < answerWithin {
			_ = w.m.RespondMsg(answerMsg(out))
		}
	}
}

func answerMsg(out []byte) *nats.Msg {
	return &nats.Msg{Data: out, Header: nats.Header{CallsOnceHeader: []string{"1"}}}
}
