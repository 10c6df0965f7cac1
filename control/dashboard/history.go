package dashboard

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// The traffic charts: each service's fleet figures as the summaries
// bring them, one point per step at most (DefaultChartStep unless
// Config.ChartStep says otherwise), for the last hour, kept in this
// process (a dashboard started a minute ago shows a minute).

// DefaultChartStep is how much time a point of the traffic charts
// stands for: 360 points for the hour a chart shows.
const DefaultChartStep = 10 * time.Second

const (
	historySpan = time.Hour
	chartWidth  = 360
	chartHeight = 60
)

type point struct {
	// at is when the figures were summed; start, when the step the point
	// stands for began (its first figures).
	at, start         time.Time
	rate, errors, p99 float64
}

type history struct {
	// step is how much time a point stands for; zero: DefaultChartStep.
	step time.Duration

	mu sync.Mutex
	// series by namespace, then service
	series map[string]map[string][]point
}

// add takes in a namespace's traffic as of at.
func (h *history) add(ns string, traffic map[string]store.ServiceTrafficStatus, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.series == nil {
		h.series = map[string]map[string][]point{}
	}
	byService := h.series[ns]
	if byService == nil {
		byService = map[string][]point{}
		h.series[ns] = byService
	}
	step := h.step
	if step <= 0 {
		step = DefaultChartStep
	}
	for svc, t := range traffic {
		p := point{at: at, start: at, rate: t.Rate, errors: t.ErrorRatio, p99: t.P99}
		pts := byService[svc]
		// The latest figures stand for the step until it ends, counted
		// from its first figures: counted from the latest, as it was, a
		// step never ended while summaries came more often than a step,
		// and the chart kept one point.
		if n := len(pts); n > 0 && at.Sub(pts[n-1].start) < step {
			p.start = pts[n-1].start
			pts[n-1] = p
		} else {
			pts = append(pts, p)
		}
		cut := 0
		for cut < len(pts) && at.Sub(pts[cut].at) > historySpan {
			cut++
		}
		byService[svc] = pts[cut:]
	}
}

// chart is one drawn series.
type chart struct {
	Title string
	// Path is an SVG path of the series, scaled to Max; only numbers.
	Path   string
	Max    string
	Last   string
	Points int
	Width  int
	Height int
}

// charts draws ns/svc's req/s, 5xx ratio and p99 over the last hour.
func (h *history) charts(ns, svc string) []chart {
	h.mu.Lock()
	pts := append([]point(nil), h.series[ns][svc]...)
	h.mu.Unlock()
	now := time.Now()
	draw := func(title string, val func(point) float64, format func(float64) string) chart {
		c := chart{Title: title, Points: len(pts), Width: chartWidth, Height: chartHeight}
		var top float64
		for _, p := range pts {
			top = max(top, val(p))
		}
		c.Max = format(top)
		if len(pts) > 0 {
			c.Last = format(val(pts[len(pts)-1]))
		}
		if top == 0 {
			top = 1
		}
		var b strings.Builder
		for i, p := range pts {
			x := float64(chartWidth) * (1 - now.Sub(p.at).Seconds()/historySpan.Seconds())
			y := float64(chartHeight) * (1 - val(p)/top)
			cmd := "L"
			if i == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&b, "%s%.1f,%.1f ", cmd, max(0, x), y)
			if len(pts) == 1 { // one point: a short stroke, so it shows
				fmt.Fprintf(&b, "L%.1f,%.1f ", max(0, x)-4, y)
			}
		}
		c.Path = strings.TrimSpace(b.String())
		return c
	}
	return []chart{
		draw("req/s", func(p point) float64 { return p.rate }, func(f float64) string { return fmt.Sprintf("%.1f", f) }),
		draw("5xx", func(p point) float64 { return p.errors }, func(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }),
		draw("p99", func(p point) float64 { return p.p99 }, func(f float64) string {
			return time.Duration(f * float64(time.Second)).Round(100 * time.Microsecond).String()
		}),
	}
}
