package manifest

import (
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Rate-limit rules. A window is counted by every gateway from the same
// wall-clock start (the time truncated to the window), so its length
// bounds what sharing can do: under a second the counts the gateways
// publish every ~250 ms would arrive after the window they count, and
// over an hour a gateway cut from the store would limit with a share
// learnt too long ago.
const (
	MinRateWindow = time.Second
	MaxRateWindow = time.Hour
)

// validateRateLimit checks a route's rate_limit (p is the route's path).
func validateRateLimit(p string, r *store.Route, add func(path, format string, args ...any)) {
	rl := r.RateLimit
	if rl == nil {
		return
	}
	p += ".rate_limit"
	if rl.Requests < 1 {
		add(p+".requests", "must be at least 1")
	}
	if w := time.Duration(rl.Window); w < MinRateWindow || w > MaxRateWindow {
		add(p+".window", "must be a duration between %s and %s", MinRateWindow, MaxRateWindow)
	}
	switch k := rl.Key; {
	case k == "", k == store.RateKeyIP, k == store.RateKeyRoute:
	case strings.HasPrefix(k, store.RateKeyHeader):
		if name := strings.TrimPrefix(k, store.RateKeyHeader); !tokenRe.MatchString(name) {
			add(p+".key", "header %q is not a valid header name", name)
		}
	default:
		add(p+".key", `must be "ip" (the default), "route" or "header:<Name>"`)
	}
}
