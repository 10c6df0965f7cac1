package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// rateFleet is n gateways' rate tables on one clock, which the test moves,
// their counts handed to each other by share (as runSharing publishes
// them, without its timing).
type rateFleet struct {
	t      *testing.T
	clock  atomic.Int64
	tables []*rateTable
	st     *store.Store
}

func newRateFleet(t *testing.T, n int) *rateFleet {
	f := &rateFleet{t: t, st: storetest.Start(t).Store}
	// A window boundary, so that a test knows where windows start.
	f.clock.Store(time.Unix(1_800_000_000, 0).UnixNano())
	for i := range n {
		rt := newRateTable(fmt.Sprintf("gw%d", i+1))
		rt.now = func() time.Time { return time.Unix(0, f.clock.Load()) }
		rt.conn.Store(f.st)
		rt.down.Store(false)
		f.tables = append(f.tables, rt)
	}
	return f
}

func (f *rateFleet) advance(d time.Duration) { f.clock.Add(int64(d)) }

func (f *rateFleet) now() time.Time { return time.Unix(0, f.clock.Load()) }

// limiters returns each table's limiter of the same route.
func (f *rateFleet) limiters(rl store.RateLimit) []*rateLimiter {
	svc := &projection.Service{Namespace: "shop", Name: "web"}
	var out []*rateLimiter
	for _, rt := range f.tables {
		l, err := rt.limiter(svc, 0, &rl)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// share delivers what each table would publish now to every table whose
// index is in to (every one when to is empty), itself included.
func (f *rateFleet) share(from []int, to ...int) {
	if len(to) == 0 {
		for i := range f.tables {
			to = append(to, i)
		}
	}
	for _, i := range from {
		for _, m := range f.tables[i].tick(f.now()) {
			b, err := json.Marshal(m)
			if err != nil {
				f.t.Fatal(err)
			}
			for _, j := range to {
				f.tables[j].receive(&nats.Msg{Subject: f.st.Names.RateCountsSubject(f.tables[i].gateway), Data: b})
			}
		}
	}
}

func (f *rateFleet) all() []int {
	var out []int
	for i := range f.tables {
		out = append(out, i)
	}
	return out
}

// allowN asks l n times for key and returns how many were allowed.
func allowN(l *rateLimiter, key uint64, n int) int {
	ok := 0
	for range n {
		if a, _ := l.allow(key, l.t.now()); a {
			ok++
		}
	}
	return ok
}

func TestRateLimitWindows(t *testing.T) {
	f := newRateFleet(t, 1)
	l := f.limiters(store.RateLimit{Requests: 10, Window: store.Duration(10 * time.Second)})[0]
	f.share(f.all()) // the store is heard
	a, b := hashKey("192.0.2.1"), hashKey("192.0.2.2")
	f.advance(2 * time.Second)
	if got := allowN(l, a, 15); got != 10 {
		t.Fatalf("allowed %d of 15 in a window of 10", got)
	}
	// Another key counts apart.
	if got := allowN(l, b, 3); got != 3 {
		t.Fatalf("another key: allowed %d of 3", got)
	}
	// Refused with the time left in the window (8 s).
	ok, wait := l.allow(a, f.now())
	if ok || wait != 8*time.Second {
		t.Fatalf("11th: allowed %v, wait %s", ok, wait)
	}
	// The window is aligned to the clock: at its end, not 10 s after the
	// first request, the key may again.
	f.advance(8 * time.Second)
	f.share(f.all())
	if got := allowN(l, a, 12); got != 10 {
		t.Fatalf("next window: allowed %d of 12", got)
	}
	// A deploy that changes the limit keeps the counts.
	l2 := f.limiters(store.RateLimit{Requests: 12, Window: store.Duration(10 * time.Second)})[0]
	if l2 != l || allowN(l, a, 5) != 2 {
		t.Fatal("a raised limit did not keep the window's count")
	}
}

func TestRateLimitKeys(t *testing.T) {
	for _, tc := range []struct {
		key  string
		same func(r1, r2 *http.Request)
		diff func(r1, r2 *http.Request)
	}{
		{"", func(r1, r2 *http.Request) { r1.RemoteAddr, r2.RemoteAddr = "192.0.2.1:1000", "192.0.2.1:2000" },
			func(r1, r2 *http.Request) { r1.RemoteAddr, r2.RemoteAddr = "192.0.2.1:1000", "192.0.2.2:1000" }},
		{"route", func(r1, r2 *http.Request) { r1.RemoteAddr, r2.RemoteAddr = "192.0.2.1:1000", "192.0.2.2:1000" }, nil},
		{"header:x-api-key", func(r1, r2 *http.Request) {
			r1.RemoteAddr, r2.RemoteAddr = "192.0.2.1:1000", "192.0.2.2:1000"
			r1.Header.Set("X-Api-Key", "k1")
			r2.Header.Set("X-Api-Key", "k1")
		}, func(r1, r2 *http.Request) {
			r1.Header.Set("X-Api-Key", "k1")
			r2.Header.Set("X-Api-Key", "k2")
		}},
	} {
		f := newRateFleet(t, 1)
		l := f.limiters(store.RateLimit{Requests: 1, Window: store.Duration(time.Second), Key: tc.key})[0]
		for _, c := range []struct {
			set  func(r1, r2 *http.Request)
			same bool
		}{{tc.same, true}, {tc.diff, false}} {
			if c.set == nil {
				continue
			}
			r1, _ := http.NewRequest("GET", "http://a.example.com/", nil)
			r2, _ := http.NewRequest("GET", "http://a.example.com/", nil)
			c.set(r1, r2)
			if (l.keyOf(r1) == l.keyOf(r2)) != c.same {
				t.Errorf("key %q: same key %v, want %v", tc.key, !c.same, c.same)
			}
		}
	}
	if _, err := newRateTable("gw").limiter(&projection.Service{}, 0, &store.RateLimit{Requests: 1, Window: store.Duration(time.Second), Key: "cookie"}); err == nil {
		t.Fatal("an unknown key was accepted: the gateway must not serve a limit it cannot enforce")
	}
}

func TestRateLimitSharedAcrossGateways(t *testing.T) {
	f := newRateFleet(t, 3)
	ls := f.limiters(store.RateLimit{Requests: 100, Window: store.Duration(10 * time.Second), Key: "route"})
	f.share(f.all())
	// 40 at gw1, 30 at gw2, shared: gw3 may take 30 more, and no more.
	if allowN(ls[0], 0, 40) != 40 || allowN(ls[1], 0, 30) != 30 {
		t.Fatal("under the limit, a request was refused")
	}
	f.share(f.all())
	if got := allowN(ls[2], 0, 50); got != 30 {
		t.Fatalf("gw3 allowed %d after the others' 70 of 100", got)
	}
	f.share(f.all())
	for i, l := range ls {
		if got := allowN(l, 0, 1); got != 0 {
			t.Fatalf("gw%d allowed a request past the fleet's limit", i+1)
		}
	}
	// Each gateway's own count is never read back as another's.
	if n := ls[0].shards[0].keys[0].others(ls[0].shards[0].keys[0].win, f.clock.Load(), ls[0].cutoff, ls[0].forget); n != 60 {
		t.Fatalf("gw1 sees the others at %d, want 60", n)
	}
}

func TestRateLimitCutOffKeepsItsShare(t *testing.T) {
	f := newRateFleet(t, 3)
	const limit = 90
	ls := f.limiters(store.RateLimit{Requests: limit, Window: store.Duration(time.Second), Key: "route"})
	// One window of traffic spread 1:1:1, shared every 250 ms.
	for range 4 {
		for _, l := range ls {
			allowN(l, 0, 10)
		}
		f.share(f.all())
		f.advance(250 * time.Millisecond)
	}
	// In the next window each learns its share (a third).
	f.share(f.all())
	for i, l := range ls {
		if s := l.shards[0].keys[0].share; s < 0.3 || s > 0.37 {
			t.Fatalf("gw%d's share %.2f, want a third", i+1, s)
		}
	}
	// gw3 is cut from the store: it stops hearing anyone, even itself,
	// and the others stop hearing it.
	f.tables[2].down.Store(true)
	f.advance(3 * time.Second) // past rateSilence
	f.share([]int{0, 1}, 0, 1)
	if got := allowN(ls[2], 0, 100); got != limit/3 {
		t.Fatalf("cut off, gw3 allowed %d, want its share %d", got, limit/3)
	}
	// The others keep gw3's usual count for it: together they allow the rest.
	got := allowN(ls[0], 0, 100)
	f.share([]int{0, 1}, 0, 1)
	got += allowN(ls[1], 0, 100)
	if got < limit*2/3-2 || got > limit*2/3 {
		t.Fatalf("gw1 and gw2 allowed %d beside the cut gw3, want about %d", got, limit*2/3)
	}
	// gw3 comes back: in the next window, it counts with the others again.
	f.tables[2].down.Store(false)
	f.advance(time.Second)
	f.share(f.all())
	if allowN(ls[0], 0, 50) != 50 {
		t.Fatal("gw1 refused under the limit after gw3 came back")
	}
	f.share(f.all())
	if got := allowN(ls[2], 0, 100); got != limit-50 {
		t.Fatalf("gw3, back, allowed %d after gw1's 50 of %d", got, limit)
	}
}

// A gateway cut off before it learnt a key's share limits it to the
// limit over the gateways it knew; a silent gateway is forgotten in time.
func TestRateLimitCutOffWithoutShare(t *testing.T) {
	f := newRateFleet(t, 4)
	ls := f.limiters(store.RateLimit{Requests: 100, Window: store.Duration(time.Second), Key: "ip"})
	f.share(f.all())
	f.tables[0].tick(f.now()) // counts the gateways heard
	f.tables[0].down.Store(true)
	if got := allowN(ls[0], hashKey("198.51.100.7"), 100); got != 25 {
		t.Fatalf("cut off with 4 gateways known: allowed %d, want 25", got)
	}
	f.advance(6 * time.Minute)
	f.share([]int{1}, 1)
	if n := len(ls[1].shards[hashKey("198.51.100.7")%rateShards].keys); n != 0 {
		t.Fatalf("gw2 still holds %d idle keys", n)
	}
}

// Keys are told in bounded messages, only those worth telling.
func TestRateLimitShareBounded(t *testing.T) {
	f := newRateFleet(t, 1)
	l := f.limiters(store.RateLimit{Requests: 100, Window: store.Duration(time.Minute)})[0]
	for i := range 2500 {
		allowN(l, hashKey(strconv.Itoa(i)), 2)
	}
	allowN(l, hashKey("one"), 1) // under 1/50 of the limit: not told
	msgs := f.tables[0].tick(f.now())
	keys := 0
	for _, m := range msgs {
		n := 0
		for _, r := range m.Routes {
			n += len(r.Keys)
		}
		if n > store.MaxRateCountKeys {
			t.Fatalf("a message of %d keys", n)
		}
		keys += n
	}
	if keys != 2500 || len(msgs) != 3 {
		t.Fatalf("%d keys told in %d messages, want 2500 in 3", keys, len(msgs))
	}
	// Told once: the next round is a heartbeat.
	if msgs := f.tables[0].tick(f.now()); len(msgs) != 1 || len(msgs[0].Routes) != 0 {
		t.Fatalf("unchanged keys told again: %+v", msgs)
	}
}

// A message naming another gateway than its subject's is dropped: a
// gateway's credentials publish on its own subject only.
func TestRateLimitCountsNameTheirSubject(t *testing.T) {
	f := newRateFleet(t, 2)
	ls := f.limiters(store.RateLimit{Requests: 5, Window: store.Duration(time.Hour), Key: "route"})
	b, _ := json.Marshal(store.RateCounts{Gateway: "gw2", Routes: []store.RateRouteCounts{{Route: ls[0].id,
		Window: f.clock.Load() / int64(time.Hour), Keys: []uint64{0}, Counts: []int64{5}}}})
	f.tables[0].receive(&nats.Msg{Subject: f.st.Names.RateCountsSubject("gw3"), Data: b})
	f.share(f.all())
	if got := allowN(ls[0], 0, 5); got != 5 {
		t.Fatalf("a forged count was believed: allowed %d of 5", got)
	}
}
