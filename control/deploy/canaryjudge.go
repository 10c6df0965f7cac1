package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// How a canary's figures from many gateways are judged. Each gateway's
// report is its own word (a stolen gateway credential reports what it
// likes, under its own name only), so the reports are not summed into
// one judgement, where one gateway reporting a hundred times the others'
// requests would decide alone. Each gateway that counted at least
// MinRequests of the new revision votes on its own figures; the gateways
// that each counted fewer vote once together, pooled, if the pool reaches
// MinRequests. Before the end of the hold a step breaches only when most
// of the live gateways (those that report applying routing, when more
// than have voted) vote that it does, so that the first gateway to
// report cannot abort alone; at the end, when most votes do, and a tie
// breaches too (a canary is promoted only when most say it is within
// limits). With one gateway this is the judgement of its own figures, as
// before; with two, a lying gateway can hold back a good canary but not
// promote a bad one; from three, one gateway decides nothing alone.

// serviceCounts are one service's canary counters per gateway (the
// report's gateway name, which its key and credentials bind).
type serviceCounts struct {
	service  string
	gateways map[string]*[2]store.RevisionCounts
}

// figuresOf turns one gateway's (or a sum's) counts into service's figures.
func figuresOf(service string, c *[2]store.RevisionCounts) store.CanaryFigures {
	return store.CanaryFigures{Service: service, Old: c[0].Totals(), New: c[1].Totals()}
}

// judgeGateways judges every service of counts, as judgeCanary does one
// set of figures, by the gateways' votes; live is how many gateways serve
// the routing (0: unknown). It returns the figures judged (each service's
// counts summed over the gateways, with the votes when there were
// several), why, and whether some service breached.
func judgeGateways(counts []serviceCounts, limits store.CanaryLimits, final bool, live int) (figs []store.CanaryFigures, reason string, breach bool) {
	var ok []string
	for _, sc := range counts {
		f, why, b, judged := judgeService(sc, limits, final, live)
		figs = append(figs, f)
		switch {
		case b && !breach:
			breach, reason = true, why
		case judged && !b:
			ok = append(ok, why)
		}
	}
	if breach {
		return figs, reason, true
	}
	if len(ok) == 0 {
		return figs, "no service judged yet", false
	}
	return figs, "within limits: " + strings.Join(ok, "; "), false
}

// judgeService judges one service by the votes of its gateways.
func judgeService(sc serviceCounts, limits store.CanaryLimits, final bool, live int) (f store.CanaryFigures, reason string, breach, judged bool) {
	limits = limits.WithDefaults()
	minReq := uint64(max(*limits.MinRequests, 0))
	names := slices.Sorted(maps.Keys(sc.gateways))
	var sum, rest [2]store.RevisionCounts
	var voters []string
	restN := 0
	for _, g := range names {
		c := sc.gateways[g]
		for i := range sum {
			sum[i].Revision = c[i].Revision
			sum[i].Add(&c[i])
		}
		if n := c[1].Totals().Requests; n >= minReq && (minReq > 0 || n > 0) {
			voters = append(voters, g)
			continue
		}
		restN++
		for i := range rest {
			rest[i].Revision = c[i].Revision
			rest[i].Add(&c[i])
		}
	}
	f = figuresOf(sc.service, &sum)
	if len(names) <= 1 {
		// One gateway: its figures, judged as they always were; but
		// while others are live and may yet report, its breach alone
		// ends nothing before the end of the hold.
		reason, breach, judged = judgeFigures(f, limits, final)
		if breach && !final && live > 1 {
			return f, "", false, false
		}
		return f, reason, breach, judged
	}
	type vote struct {
		who    string
		reason string
		breach bool
	}
	var votes []vote
	for _, g := range voters {
		gf := figuresOf(sc.service, sc.gateways[g])
		why, b, _ := judgeFigures(gf, limits, false)
		votes = append(votes, vote{who: "gateway " + g, reason: why, breach: b})
		f.Votes = append(f.Votes, store.CanaryVote{Gateway: g, Old: gf.Old, New: gf.New, Breach: b})
	}
	if restN > 0 {
		rf := figuresOf(sc.service, &rest)
		if rf.New.Requests >= minReq && rf.New.Requests > 0 {
			why, b, _ := judgeFigures(rf, limits, false)
			votes = append(votes, vote{who: fmt.Sprintf("%d gateways pooled", restN), reason: why, breach: b})
			f.Votes = append(f.Votes, store.CanaryVote{Old: rf.Old, New: rf.New, Breach: b})
		}
	}
	if len(votes) == 0 {
		// Nobody counted enough, pooled or not: as for one gateway (which
		// can only be the end of the hold's "too few").
		reason, breach, judged = judgeFigures(f, limits, final)
		return f, reason, breach, judged
	}
	var against []vote
	for _, v := range votes {
		if v.breach {
			against = append(against, v)
		}
	}
	n, b := len(votes), len(against)
	if (final && (2*b > n || (b > 0 && 2*b == n))) || (!final && 2*b > max(n, live)) {
		return f, fmt.Sprintf("%d of %d gateway votes breach; %s says %s", b, n, against[0].who, against[0].reason), true, true
	}
	if b > 0 && !final {
		// A minority sees a breach: not judged yet, the hold goes on.
		return f, "", false, false
	}
	return f, fmt.Sprintf("%s: %d of %d gateway votes within limits (summed: revision %d %d requests, 5xx %.2f%%; revision %d %d requests, 5xx %.2f%%)",
		sc.service, n-b, n, f.New.Revision, f.New.Requests, 100*f.New.ErrorRatio, f.Old.Revision, f.Old.Requests, 100*f.Old.ErrorRatio), false, true
}
