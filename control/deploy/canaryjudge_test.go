package deploy

import (
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// sides are one gateway's counts of both sides: requests and 5xx of the
// old revision (answered within 4 ms) and the new (within newP99).
func sides(oldReq, oldErr, newReq, newErr uint64, newP99 float64) *[2]store.RevisionCounts {
	side := func(rev int64, req, errs uint64, p99 float64) store.RevisionCounts {
		return store.RevisionCounts{Revision: rev, Classes: [5]uint64{0, req - errs, 0, 0, errs}, Latency: latencyAt(p99, req)}
	}
	return &[2]store.RevisionCounts{side(1, oldReq, oldErr, 0.004), side(2, newReq, newErr, newP99)}
}

func webCounts(gws map[string]*[2]store.RevisionCounts) []serviceCounts {
	return []serviceCounts{{service: "web", gateways: gws}}
}

// One gateway reporting a hundred times the requests of the others (its
// credentials are bound to its name, so one report is all it has) decides
// nothing alone: a bad canary the others see is still aborted, early; a
// good one is still promoted at the end of the hold, whether the liar
// hides the errors or invents them.
func TestJudgeGatewaysOutvotesALyingGateway(t *testing.T) {
	cases := []struct {
		name   string
		gws    map[string]*[2]store.RevisionCounts
		final  bool
		breach bool
		says   string
	}{
		{"bad canary, liar hides the errors: aborted early", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 5, 0.004), "gw2": sides(900, 0, 100, 6, 0.004),
			"liar": sides(90_000, 0, 10_000, 0, 0.004)}, false, true, "2 of 3 gateway votes breach; gateway gw1 says web: 5xx ratio of revision 2 is 5.00% (5 of 100)"},
		{"bad canary, liar hides the latency: aborted early", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 0, 0.2), "gw2": sides(900, 0, 100, 0, 0.2),
			"liar": sides(90_000, 0, 10_000, 0, 0.004)}, false, true, "2 of 3 gateway votes breach"},
		{"good canary, liar invents errors: not aborted early", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 0, 0.004), "gw2": sides(900, 0, 100, 0, 0.004),
			"liar": sides(90_000, 0, 10_000, 9_000, 0.004)}, false, false, "no service judged yet"},
		{"good canary, liar invents errors: promoted", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 0, 0.004), "gw2": sides(900, 0, 100, 0, 0.004),
			"liar": sides(90_000, 0, 10_000, 9_000, 0.004)}, true, false, "web: 2 of 3 gateway votes within limits"},
		{"good canary, liar invents latency: promoted", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 0, 0.004), "gw2": sides(900, 0, 100, 0, 0.004),
			"liar": sides(90_000, 0, 10_000, 0, 5)}, true, false, "2 of 3 gateway votes within limits"},
		// Two gateways: no majority. A tie at the end aborts, so a liar
		// can hold back a good canary but never promote a bad one.
		{"two gateways, liar hides the errors: aborted at the end", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 5, 0.004), "liar": sides(90_000, 0, 10_000, 0, 0.004)}, true, true, "1 of 2 gateway votes breach"},
		{"two gateways, a tie does not abort early", map[string]*[2]store.RevisionCounts{
			"gw1": sides(900, 0, 100, 5, 0.004), "liar": sides(90_000, 0, 10_000, 0, 0.004)}, false, false, "no service judged yet"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			figs, reason, breach := judgeGateways(webCounts(tc.gws), store.CanaryLimits{}, tc.final, len(tc.gws))
			if breach != tc.breach || !strings.Contains(reason, tc.says) {
				t.Fatalf("judged breach=%v %q; want breach=%v and %q", breach, reason, tc.breach, tc.says)
			}
			if len(figs) != 1 || len(figs[0].Votes) != len(tc.gws) {
				t.Fatalf("figures %+v: want one service with a vote per gateway", figs)
			}
		})
	}
}

// The first gateway to report decides nothing alone while others are
// live: its breach waits for theirs (or the end of the hold).
func TestJudgeGatewaysFirstReportWaitsForTheOthers(t *testing.T) {
	liar := map[string]*[2]store.RevisionCounts{"liar": sides(90_000, 0, 10_000, 9_000, 0.004)}
	if _, reason, breach := judgeGateways(webCounts(liar), store.CanaryLimits{}, false, 3); breach {
		t.Fatalf("one gateway's report among 3 live aborted early: %s", reason)
	}
	both := map[string]*[2]store.RevisionCounts{"liar": liar["liar"], "gw1": sides(900, 0, 100, 0, 0.004)}
	if _, reason, breach := judgeGateways(webCounts(both), store.CanaryLimits{}, false, 3); breach {
		t.Fatalf("one breach of two reports among 3 live aborted early: %s", reason)
	}
	if _, reason, breach := judgeGateways(webCounts(liar), store.CanaryLimits{}, false, 1); !breach {
		t.Fatalf("the only live gateway's breach did not abort: %s", reason)
	}
}

// Honest fleets are judged as before: one gateway's figures exactly as
// judgeCanary judges them; gateways that each counted too few vote once,
// pooled; one busy gateway beside idle ones decides on its own figures.
// Those two decide at the end of the hold: before it, a step breaches
// only when most live gateways vote so, each on its own figures.
func TestJudgeGatewaysHonestFleets(t *testing.T) {
	cases := []struct {
		name   string
		gws    map[string]*[2]store.RevisionCounts
		final  bool
		breach bool
		says   string
	}{
		{"one gateway, bad", map[string]*[2]store.RevisionCounts{"gw1": sides(1000, 0, 100, 5, 0.004)}, false, true,
			"web: 5xx ratio of revision 2 is 5.00% (5 of 100) against 0.00% (0 of 1000)"},
		{"one gateway, good", map[string]*[2]store.RevisionCounts{"gw1": sides(1000, 0, 100, 0, 0.004)}, true, false,
			"within limits: web: revision 2 100 requests"},
		{"one gateway, too few at the end", map[string]*[2]store.RevisionCounts{"gw1": sides(1000, 0, 10, 0, 0.004)}, true, true,
			"only 10 requests reached revision 2 during the hold (min_requests 20)"},
		{"three small gateways pooled, bad, early", map[string]*[2]store.RevisionCounts{
			"gw1": sides(90, 0, 10, 1, 0.004), "gw2": sides(90, 0, 10, 1, 0.004), "gw3": sides(90, 0, 10, 0, 0.004)}, false, false,
			"no service judged yet"},
		{"three small gateways pooled, bad", map[string]*[2]store.RevisionCounts{
			"gw1": sides(90, 0, 10, 1, 0.004), "gw2": sides(90, 0, 10, 1, 0.004), "gw3": sides(90, 0, 10, 0, 0.004)}, true, true,
			"1 of 1 gateway votes breach; 3 gateways pooled says web: 5xx ratio of revision 2 is 6.67% (2 of 30)"},
		{"three small gateways, too few together", map[string]*[2]store.RevisionCounts{
			"gw1": sides(90, 0, 5, 0, 0.004), "gw2": sides(90, 0, 5, 0, 0.004), "gw3": sides(90, 0, 5, 0, 0.004)}, true, true,
			"only 15 requests reached revision 2"},
		// Early, the busy one is not most of the live gateways: its
		// breach ends the hold, not the step at once.
		{"one busy gateway beside idle ones, bad, early", map[string]*[2]store.RevisionCounts{
			"busy": sides(9000, 0, 1000, 50, 0.004), "idle1": sides(9, 0, 1, 0, 0.004), "idle2": sides(0, 0, 0, 0, 0.004)}, false, false,
			"no service judged yet"},
		{"one busy gateway beside idle ones, bad", map[string]*[2]store.RevisionCounts{
			"busy": sides(9000, 0, 1000, 50, 0.004), "idle1": sides(9, 0, 1, 0, 0.004), "idle2": sides(0, 0, 0, 0, 0.004)}, true, true,
			"1 of 1 gateway votes breach; gateway busy says web: 5xx ratio of revision 2 is 5.00% (50 of 1000)"},
		{"one busy gateway beside idle ones, good", map[string]*[2]store.RevisionCounts{
			"busy": sides(9000, 0, 1000, 0, 0.004), "idle1": sides(9, 0, 1, 1, 0.004)}, true, false,
			"web: 1 of 1 gateway votes within limits (summed: revision 2 1001 requests"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, reason, breach := judgeGateways(webCounts(tc.gws), store.CanaryLimits{}, tc.final, len(tc.gws))
			if breach != tc.breach || !strings.Contains(reason, tc.says) {
				t.Fatalf("judged breach=%v %q; want breach=%v and %q", breach, reason, tc.breach, tc.says)
			}
			if len(tc.gws) == 1 {
				f := figuresOf("web", tc.gws["gw1"])
				want, wantBreach := judgeCanary([]store.CanaryFigures{f}, store.CanaryLimits{}, tc.final)
				if reason != want || breach != wantBreach {
					t.Fatalf("one gateway judged %v %q; judgeCanary says %v %q", breach, reason, wantBreach, want)
				}
			}
		})
	}
}
