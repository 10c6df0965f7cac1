package caddymodule

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// How the gateways share their rate-limit counts: every rateShareInterval
// each publishes, for each route it limits, the keys whose count changed
// and is worth telling (at least 1/rateShareFloor of the limit: a key a
// gateway barely sees moves no fleet near its limit), in messages of at
// most store.MaxRateCountKeys keys, at most rateShareMessages per round
// (what does not fit waits for the next). With nothing to tell it still
// publishes an empty message: its own echo is how a gateway knows the
// store reaches it, and the others that it is alive.
const (
	rateShareInterval = 250 * time.Millisecond
	rateShareFloor    = 50
	rateShareMessages = 8
	// ratePeerFresh is how recently a gateway must have been heard to
	// count among the gateways the fleet has.
	ratePeerFresh = 2 * time.Second
)

// runSharing shares counts on the connection conn returns (the
// projection's latest) until ctx ends.
func (t *rateTable) runSharing(ctx context.Context, conn func() *store.Store, logger *zap.Logger) {
	tick := time.NewTicker(rateShareInterval)
	defer tick.Stop()
	var sub *nats.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := conn()
		if st == nil {
			continue
		}
		t.down.Store(!st.NC.IsConnected())
		if cur := t.conn.Load(); cur != st || sub == nil {
			if sub != nil {
				_ = sub.Unsubscribe()
				sub = nil
			}
			s, err := st.NC.Subscribe(st.Names.RateCountsWildcard(), t.receive)
			if err != nil {
				logger.Warn("subscribing to the fleet's rate-limit counts", zap.Error(err))
				continue
			}
			sub = s
			t.conn.Store(st)
		}
		msgs := t.tick(t.now())
		if msgs == nil {
			continue
		}
		subject := st.Names.RateCountsSubject(t.gateway)
		for _, m := range msgs {
			b, err := json.Marshal(m)
			if err == nil {
				err = st.NC.Publish(subject, b)
			}
			if err != nil && st.NC.IsConnected() {
				logger.Warn("publishing rate-limit counts", zap.Error(err))
				break
			}
		}
	}
}

// receive notes a gateway's counts (its own echo only says the store is
// reachable). The subject says which gateway counted: its credentials
// publish on its own only, so a message naming another is dropped.
func (t *rateTable) receive(m *nats.Msg) {
	var rc store.RateCounts
	if err := json.Unmarshal(m.Data, &rc); err != nil || rc.Gateway == "" ||
		m.Subject[strings.LastIndexByte(m.Subject, '.')+1:] != store.SubjectToken(rc.Gateway) {
		return
	}
	now := t.now().UnixNano()
	t.heard.Store(now)
	if rc.Gateway == t.gateway {
		return
	}
	t.mu.Lock()
	p := t.peers[rc.Gateway]
	if p == nil {
		p = &ratePeer{name: rc.Gateway}
		t.peers[rc.Gateway] = p
	}
	p.heard.Store(now)
	ls := make([]*rateLimiter, len(rc.Routes))
	for i, r := range rc.Routes {
		ls[i] = t.routes[r.Route]
	}
	t.mu.Unlock()
	for i, r := range rc.Routes {
		if ls[i] == nil || len(r.Keys) != len(r.Counts) {
			continue
		}
		ls[i].note(p, r)
	}
}

// note records peer's counts of r.
func (l *rateLimiter) note(p *ratePeer, r store.RateRouteCounts) {
	for i, key := range r.Keys {
		n := r.Counts[i]
		sh := &l.shards[key%rateShards]
		sh.mu.Lock()
		ks := sh.keys[key]
		if ks == nil {
			ks = &rateKeyState{}
			sh.keys[key] = ks
		}
		j := slices.IndexFunc(ks.peers, func(pc peerCount) bool { return pc.peer == p })
		if j < 0 {
			ks.peers = append(ks.peers, peerCount{peer: p})
			j = len(ks.peers) - 1
		}
		pc := &ks.peers[j]
		switch {
		case r.Window > pc.win:
			if pc.win == r.Window-1 {
				pc.prevWin, pc.prevN = pc.win, pc.n
			} else {
				pc.prevWin, pc.prevN = r.Window-1, 0
			}
			pc.win, pc.n = r.Window, n
		case r.Window == pc.win && n > pc.n:
			pc.n = n
		}
		sh.mu.Unlock()
	}
}

// tick updates the shares (while the store is reachable), forgets idle
// keys and silent gateways, and returns the messages to publish: nil
// when this gateway limits no route.
func (t *rateTable) tick(now time.Time) []store.RateCounts {
	ns := now.UnixNano()
	t.mu.Lock()
	ls := make([]*rateLimiter, 0, len(t.routes))
	for _, l := range t.routes {
		ls = append(ls, l)
	}
	known := int64(1)
	for name, p := range t.peers {
		switch age := ns - p.heard.Load(); {
		case age <= int64(ratePeerFresh):
			known++
		case age > int64(10*time.Minute):
			delete(t.peers, name)
		}
	}
	t.mu.Unlock()
	if len(ls) == 0 {
		return nil
	}
	if !t.cut(ns, ratePeerFresh) {
		t.known.Store(known)
	}
	slices.SortFunc(ls, func(a, b *rateLimiter) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	out := []store.RateCounts{{Gateway: t.gateway}}
	keys := 0
	for _, l := range ls {
		l.sweep(ns, func(r store.RateRouteCounts) bool {
			if keys+len(r.Keys) > store.MaxRateCountKeys {
				if len(out) == rateShareMessages {
					return false
				}
				out, keys = append(out, store.RateCounts{Gateway: t.gateway}), 0
			}
			cur := &out[len(out)-1]
			cur.Routes = append(cur.Routes, r)
			keys += len(r.Keys)
			return true
		})
	}
	return out
}

// sweep goes over l's keys at ns: updates each key's share from the last
// window while the store is reachable, forgets keys idle for two windows
// and gateways silent past forget, and hands publish the keys to tell in
// batches (at most store.MaxRateCountKeys); a batch publish refuses stays
// to tell.
func (l *rateLimiter) sweep(ns int64, publish func(store.RateRouteCounts) bool) {
	w := ns / int64(l.window)
	reachable := !l.t.cut(ns, l.cutoff)
	floor := max(l.limit.Load()/rateShareFloor, 1)
	full := false
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		batch := store.RateRouteCounts{Route: l.id, Window: w}
		var told []*rateKeyState
		for key, ks := range sh.keys {
			ks.peers = slices.DeleteFunc(ks.peers, func(pc peerCount) bool { return ns-pc.peer.heard.Load() > int64(l.forget) })
			if reachable {
				fleet := ks.ownIn(w - 1)
				own := fleet
				for j := range ks.peers {
					if ns-ks.peers[j].peer.heard.Load() <= int64(l.cutoff) {
						fleet += ks.peers[j].in(w - 1)
					}
				}
				if fleet > 0 {
					ks.share = float64(own) / float64(fleet)
				}
			}
			// A silent gateway's count stays reserved until forgotten.
			idle := ks.win < w-1 && !slices.ContainsFunc(ks.peers, func(pc peerCount) bool {
				return pc.win >= w-1 || ns-pc.peer.heard.Load() > int64(l.cutoff)
			})
			if idle {
				delete(sh.keys, key)
				continue
			}
			if !full && ks.win == w && ks.dirty && ks.n >= floor {
				batch.Keys = append(batch.Keys, key)
				batch.Counts = append(batch.Counts, ks.n)
				told = append(told, ks)
				if len(batch.Keys) == store.MaxRateCountKeys {
					full = !l.flush(&batch, told, publish)
					told = told[:0]
				}
			}
		}
		if !full && len(batch.Keys) > 0 {
			full = !l.flush(&batch, told, publish)
		}
		sh.mu.Unlock()
	}
}

// flush hands batch to publish and marks its keys told if it took them.
func (l *rateLimiter) flush(batch *store.RateRouteCounts, told []*rateKeyState, publish func(store.RateRouteCounts) bool) bool {
	if !publish(*batch) {
		return false
	}
	for _, ks := range told {
		ks.dirty = false
	}
	batch.Keys, batch.Counts = nil, nil
	return true
}

// latestStore is the projection's latest connection, nil before one.
func (s *sharedProjection) latestStore() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		return nil
	}
	return s.conns[len(s.conns)-1]
}
