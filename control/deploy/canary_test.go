package deploy

import (
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// latencyAt is a histogram with n responses in the bucket of bound s.
func latencyAt(s float64, n uint64) []uint64 {
	h := make([]uint64, len(store.TrafficLatencyBounds)+1)
	for i, b := range store.TrafficLatencyBounds {
		if s <= b {
			h[i] = n
			return h
		}
	}
	h[len(h)-1] = n
	return h
}

func figures(oldReq, oldErr, newReq, newErr uint64, oldP99, newP99 float64) store.CanaryFigures {
	side := func(rev int64, req, errs uint64, p99 float64) store.RevisionTotals {
		c := store.RevisionCounts{Revision: rev, Classes: [5]uint64{0, req - errs, 0, 0, errs}, Latency: latencyAt(p99, req)}
		return c.Totals()
	}
	return store.CanaryFigures{Service: "web", Old: side(1, oldReq, oldErr, oldP99), New: side(2, newReq, newErr, newP99)}
}

// Every limit, early and at the end of a hold, with the figures it names.
func TestJudgeCanary(t *testing.T) {
	two, zero := 2, 0
	cases := []struct {
		name   string
		figs   []store.CanaryFigures
		limits store.CanaryLimits
		final  bool
		breach bool
		says   string
	}{
		{"good", []store.CanaryFigures{figures(1000, 0, 100, 0, 0.004, 0.004)}, store.CanaryLimits{}, true, false, "within limits: web: revision 2 100 requests"},
		{"5xx past the limit", []store.CanaryFigures{figures(1000, 0, 100, 5, 0.004, 0.004)}, store.CanaryLimits{}, false, true, "5xx ratio of revision 2 is 5.00% (5 of 100) against 0.00% (0 of 1000)"},
		{"5xx within the old's plus the limit", []store.CanaryFigures{figures(1000, 40, 100, 4, 0.004, 0.004)}, store.CanaryLimits{}, true, false, "within limits"},
		{"5xx under a looser limit", []store.CanaryFigures{figures(1000, 0, 100, 5, 0.004, 0.004)}, store.CanaryLimits{Max5xxRatio: 0.1}, true, false, "within limits"},
		{"too few to abort early", []store.CanaryFigures{figures(1000, 0, 10, 5, 0.004, 0.004)}, store.CanaryLimits{}, false, false, "no service judged yet"},
		{"too few at the end", []store.CanaryFigures{figures(1000, 0, 10, 0, 0.004, 0.004)}, store.CanaryLimits{}, true, true, "only 10 requests reached revision 2 during the hold (min_requests 20)"},
		{"no minimum", []store.CanaryFigures{figures(1000, 0, 0, 0, 0.004, 0)}, store.CanaryLimits{MinRequests: &zero}, true, false, "web: no requests"},
		{"min 2 aborts on 1 of 2", []store.CanaryFigures{figures(1000, 0, 2, 1, 0.004, 0.004)}, store.CanaryLimits{MinRequests: &two}, false, true, "5xx ratio"},
		{"slow under the floor", []store.CanaryFigures{figures(1000, 0, 100, 0, 0.001, 0.04)}, store.CanaryLimits{}, true, false, "within limits"},
		{"slow past the floor", []store.CanaryFigures{figures(1000, 0, 100, 0, 0.004, 0.2)}, store.CanaryLimits{}, true, true, "p99 of revision 2 is"},
		{"slow against a slow old", []store.CanaryFigures{figures(1000, 0, 100, 0, 0.2, 0.2)}, store.CanaryLimits{}, true, false, "within limits"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reason, breach := judgeCanary(tc.figs, tc.limits, tc.final)
			if breach != tc.breach || !strings.Contains(reason, tc.says) {
				t.Fatalf("judged breach=%v %q; want breach=%v and %q", breach, reason, tc.breach, tc.says)
			}
		})
	}
}
