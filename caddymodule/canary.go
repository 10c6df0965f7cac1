package caddymodule

import (
	"math/rand/v2"
	"net/http"
	"sync/atomic"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Canary sides. A split service's request goes to one side, decided
// before the proxy picks an upstream: the request variable varSide tells
// the upstream source which endpoints to give.
const (
	sideOld = 0
	sideNew = 1
	// unsplit: the service is not split; every endpoint serves.
	unsplit = -1
)

const varSide = "edgeplane.side"

type wrrMemo struct{}

// pickSide decides which side of svc's split r goes to, and whether the
// client's bucket cookie chose it. A request the split's match selects
// goes to the new side; a client with a bucket cookie signed under key
// for this canary goes where its bucket falls; any other (a forged or
// stale cookie included) follows a counter that sends exactly Weight of
// every 100 requests to the new side (and, when sticky and key is known,
// gets the signed cookie of a bucket on the side it was sent to, so that
// raising the weight only ever moves clients to the new revision). A side
// without endpoints sends everything to the other.
func pickSide(w http.ResponseWriter, r *http.Request, svc *projection.Service, key []byte) (side int, byCookie bool) {
	sp := svc.Split
	old, fresh := svc.Sides()
	switch {
	case len(fresh) == 0:
		return sideOld, false
	case len(old) == 0:
		return sideNew, false
	case sp.Match != nil && matches(r, sp.Match):
		return sideNew, false
	}
	weight := min(max(sp.Weight, 0), 100)
	cut := weight * store.CanaryBuckets / 100
	sticky := sp.Sticky && key != nil
	if sticky {
		if c, err := r.Cookie(store.StickyCookie); err == nil {
			if b, ok := store.CanaryBucketOf(key, sp.Deploy, c.Value); ok {
				if b < cut {
					return sideNew, true
				}
				return sideOld, true
			}
		}
	}
	side = countedSide(svc, weight)
	if sticky {
		b := cut + rand.IntN(max(store.CanaryBuckets-cut, 1))
		if side == sideNew {
			b = rand.IntN(cut) // weight > 0 here
		}
		http.SetCookie(w, &http.Cookie{
			Name: store.StickyCookie, Value: store.SignCanaryBucket(key, sp.Deploy, b), Path: "/", MaxAge: 7 * 24 * 3600,
			HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode,
		})
	}
	return side, false
}

// countedSide sends exactly weight of every 100 calls for svc to the new
// side, the rest to the old: requests without a cookie, and layer-4
// connections, which are split by connection.
func countedSide(svc *projection.Service, weight int) int {
	n := svc.Memo(wrrMemo{}, func(*projection.Service) any { return new(atomic.Uint64) }).(*atomic.Uint64).Add(1)
	// Over any 100 consecutive n, n*weight mod 100 falls below weight
	// exactly weight times.
	if (n*uint64(weight))%100 < uint64(weight) {
		return sideNew
	}
	return sideOld
}

// matches reports whether r carries m's header or cookie with m's value.
func matches(r *http.Request, m *store.CanaryMatch) bool {
	if m.Header != "" {
		for _, v := range r.Header.Values(m.Header) {
			if v == m.Value {
				return true
			}
		}
	}
	if m.Cookie != "" {
		if c, err := r.Cookie(m.Cookie); err == nil && c.Value == m.Value {
			return true
		}
	}
	return false
}
