package dashboard

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/store"
)

// Page sizes: a page costs its rows, not the fleet's.
const (
	namespacesPerPage = 50
	machinesPerPage   = 100
	historyShown      = 10
)

// pageData is what every page has.
type pageData struct {
	Title string
	// Scope is what change events refresh the page: "*" any, a
	// namespace, or "none".
	Scope string
	At    time.Time
}

// pager is one page of a longer list.
type pager struct {
	Page, Pages, Total int
}

func (p pager) Prev() int { return p.Page - 1 }
func (p pager) Next() int { return p.Page + 1 }

// paginate cuts the page of n items r asks for (?page=N, from 1).
func paginate(r *http.Request, n, per int) (pager, int, int) {
	pages := max(1, (n+per-1)/per)
	page, err := strconv.Atoi(r.URL.Query().Get("page"))
	if err != nil || page < 1 {
		page = 1
	}
	page = min(page, pages)
	from := (page - 1) * per
	return pager{Page: page, Pages: pages, Total: n}, from, min(n, from+per)
}

// page serves one page: the whole document, or only its body when the
// page's script asks for a refresh (X-Fragment).
func (d *Server) page(name string, data func(r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		v, err := data(r.WithContext(ctx))
		if err != nil {
			status := http.StatusServiceUnavailable
			if store.HasCode(err, store.CodeNotFound) {
				status = http.StatusNotFound
			}
			d.log.Debug("dashboard page", zap.String("path", r.URL.Path), zap.Error(err))
			d.render(w, r, "error", status, &errorData{pageData: pageData{Title: "error", Scope: "none", At: time.Now()}, Message: err.Error()})
			return
		}
		d.render(w, r, name, http.StatusOK, v)
	})
}

type errorData struct {
	pageData
	Message string
}

// render executes a page template into a buffer first, so that a
// template error is a clean 500 and not half a page.
func (d *Server) render(w http.ResponseWriter, r *http.Request, name string, status int, v any) {
	tmpl := "layout"
	if r.Header.Get("X-Fragment") != "" {
		tmpl = "body"
	}
	var buf bytes.Buffer
	if err := d.pages[name].ExecuteTemplate(&buf, tmpl, v); err != nil {
		d.log.Error("dashboard template", zap.String("page", name), zap.Error(err))
		http.Error(w, "page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// readCache keeps the fleet-wide reads for a moment, so that many open
// pages refreshing at once read the store once.
type readCache struct {
	mu         sync.Mutex
	sumsAt     time.Time
	sums       map[string]store.NamespaceStatus
	machinesAt time.Time
	machines   []machines.Listed
}

const readCacheTTL = time.Second

// summaries are every namespace's fleet summary.
func (d *Server) summaries(ctx context.Context) (map[string]store.NamespaceStatus, error) {
	c := &d.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.sumsAt) < readCacheTTL {
		return c.sums, nil
	}
	sums, err := fleet.Read(ctx, d.s)
	if err != nil {
		return nil, err
	}
	c.sumsAt, c.sums = time.Now(), sums
	return sums, nil
}

// machineList is every machine with its liveness and state, by ID.
func (d *Server) machineList(ctx context.Context) ([]machines.Listed, error) {
	c := &d.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.machinesAt) < readCacheTTL {
		return c.machines, nil
	}
	list, err := machines.List(ctx, d.s, false, 0)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b machines.Listed) int { return strings.Compare(a.ID, b.ID) })
	c.machinesAt, c.machines = time.Now(), list
	return list, nil
}

// forget drops the cached reads: a change event means they are old.
func (c *readCache) forget() {
	c.mu.Lock()
	c.sumsAt, c.machinesAt = time.Time{}, time.Time{}
	c.mu.Unlock()
}

type nsRow struct {
	Name      string
	Revision  int64
	Deploy    string
	Destroyed bool
	Counts    store.Counts
	Machines  int
	Traffic   store.TrafficFigures
	Services  int
}

type overviewData struct {
	pageData
	Namespaces []nsRow
	Pager      pager
	Machines   struct {
		Total    int
		Liveness map[string]int
		NotFresh []machines.Listed
		More     int
	}
	// Releases counts machines by the release their agent runs; Upgrades
	// are machines whose latest upgrade is on trial or rolled back.
	Releases   []releaseCount
	Upgrades   []machines.Listed
	Rollout    *store.RolloutRecord
	Gateways   []fleet.Gateway
	RoutingSeq uint64
	Certs      []certs.Status
	Doctor     *doctor.Report
	// Regions are the fleet's regions, their states and traffic (none
	// when nothing has a region); RegionsUnreadable says why their states
	// could not be read.
	Regions           []status.Region
	RegionsUnreadable string
	l4Reports
}

// releaseCount is how many machines run a release.
type releaseCount struct {
	Release  string
	Machines int
}

// certSoon is how close to expiry a certificate is shown.
const certSoon = 30 * 24 * time.Hour

func (d *Server) overview(r *http.Request) (any, error) {
	ctx := r.Context()
	v := &overviewData{pageData: pageData{Title: "fleet", Scope: "*", At: time.Now()}, Doctor: d.doctor.Load()}
	sums, err := d.summaries(ctx)
	if err != nil {
		return nil, err
	}
	list, err := d.machineList(ctx)
	if err != nil {
		return nil, err
	}
	nss, err := d.s.CommittedNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(nss)
	var from, to int
	v.Pager, from, to = paginate(r, len(nss), namespacesPerPage)
	for _, ns := range nss[from:to] {
		row := nsRow{Name: ns}
		if live, err := d.s.LiveCommit(ctx, ns); err == nil {
			row.Revision, row.Deploy, row.Destroyed = live.Revision, live.ID, live.Destroy
		}
		if sum, ok := sums[ns]; ok {
			row.Counts, row.Machines, row.Services = sum.Counts, len(sum.Machines), len(sum.Traffic)
			row.Traffic = sumTraffic(sum.Traffic)
		}
		v.Namespaces = append(v.Namespaces, row)
	}
	v.Machines.Total, v.Machines.Liveness = len(list), map[string]int{}
	byRelease := map[string]int{}
	for _, m := range list {
		r := m.Release
		if r == "" {
			r = "unknown"
		}
		byRelease[r]++
		if u := m.Upgrade; u != nil && u.State != upgrade.StateConfirmed && len(v.Upgrades) < 20 {
			v.Upgrades = append(v.Upgrades, m)
		}
		v.Machines.Liveness[m.Liveness]++
		if m.Liveness != store.MachineFresh {
			if len(v.Machines.NotFresh) < 20 {
				v.Machines.NotFresh = append(v.Machines.NotFresh, m)
			} else {
				v.Machines.More++
			}
		}
	}
	for r, n := range byRelease {
		v.Releases = append(v.Releases, releaseCount{Release: r, Machines: n})
	}
	slices.SortFunc(v.Releases, func(a, b releaseCount) int {
		if a.Machines != b.Machines {
			return b.Machines - a.Machines
		}
		return strings.Compare(a.Release, b.Release)
	})
	if v.Rollout, err = d.s.LatestRollout(ctx); err != nil {
		return nil, err
	}
	if v.RoutingSeq, v.Gateways, err = fleet.Gateways(ctx, d.s); err != nil {
		return nil, err
	}
	v.Regions, v.RegionsUnreadable = status.ReadRegions(ctx, d.s, list, v.Gateways, sums)
	v.L4Errors, v.L4Draining, v.L4ErrorsAll, v.L4DrainsAll = gatewayL4(v.Gateways, "", v.At)
	cs, err := certs.ListStatus(ctx, d.s)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.LastError != "" || (!c.Expiry.IsZero() && time.Until(c.Expiry) < certSoon) {
			v.Certs = append(v.Certs, c)
		}
	}
	slices.SortFunc(v.Certs, func(a, b certs.Status) int { return a.Expiry.Compare(b.Expiry) })
	return v, nil
}

// sumTraffic is a namespace's traffic over its services: rates and
// counts add up; the error ratio is weighted by rate; the p99 shown is
// the worst service's.
func sumTraffic(svcs map[string]store.ServiceTrafficStatus) store.TrafficFigures {
	var f store.TrafficFigures
	var errRate float64
	for _, s := range svcs {
		f.Requests += s.Requests
		f.Errors += s.Errors
		f.Rate += s.Rate
		f.Open += s.Open
		errRate += s.Rate * s.ErrorRatio
		f.P99 = max(f.P99, s.P99)
	}
	if f.Rate > 0 {
		f.ErrorRatio = errRate / f.Rate
	}
	return f
}

type machinesData struct {
	pageData
	Machines []machines.Listed
	Pager    pager
}

func (d *Server) machines(r *http.Request) (any, error) {
	list, err := d.machineList(r.Context())
	if err != nil {
		return nil, err
	}
	v := &machinesData{pageData: pageData{Title: "machines", Scope: "*", At: time.Now()}}
	var from, to int
	v.Pager, from, to = paginate(r, len(list), machinesPerPage)
	v.Machines = list[from:to]
	return v, nil
}

// historyRow is one final commit and what it changed from the one before.
type historyRow struct {
	ID        string
	Revision  int64
	CreatedAt time.Time
	Note      string
	Changes   []string
}

type instanceRow struct {
	store.InstanceRecord
	// Aside says, per gateway, why it sends the instance no new request.
	Aside []string
}

type routeRow struct {
	Service  string
	Hosts    []string
	Prefixes []string
}

type serviceTraffic struct {
	Service  string
	Figures  store.TrafficFigures
	Gateways []gatewayTraffic
	Charts   []chart
}

type gatewayTraffic struct {
	Gateway string
	Figures store.TrafficFigures
}

type namespaceData struct {
	pageData
	Namespace string
	Live      *store.DeployCommit
	Latest    *store.DeployStatus
	Phases    []store.PhaseRecord
	Counts    *store.Counts
	History   []historyRow
	Instances []instanceRow
	Routes    []routeRow
	Traffic   []serviceTraffic
	// Layer4 are the live commit's services exposing anything below
	// HTTP, and what the gateways report of this namespace's ports.
	Layer4 []l4Row
	l4Reports
}

func (d *Server) namespace(r *http.Request) (any, error) {
	ctx := r.Context()
	ns := r.PathValue("ns")
	if !store.ValidToken(ns) {
		return nil, store.Errorf(store.CodeNotFound, "no namespace %q", ns)
	}
	v := &namespaceData{pageData: pageData{Title: ns, Scope: ns, At: time.Now()}, Namespace: ns}
	hist, _, err := d.deploys.History(ctx, ns)
	if err != nil {
		return nil, err
	}
	if len(hist) == 0 {
		return nil, store.Errorf(store.CodeNotFound, "namespace %s has no committed deploy", ns)
	}
	v.Live = &hist[len(hist)-1]
	for i := len(hist) - 1; i >= 0 && len(v.History) < historyShown; i-- {
		c := &hist[i]
		row := historyRow{ID: c.ID, Revision: c.Revision, CreatedAt: c.CreatedAt}
		switch {
		case c.Destroy:
			row.Note = "destroy"
		case c.RollbackOf != "":
			row.Note = "rollback to " + c.RollbackOf
		}
		var prev *store.Manifest
		if i > 0 {
			prev = &hist[i-1].Manifest
		}
		row.Changes = manifestChanges(prev, &c.Manifest)
		v.History = append(v.History, row)
	}
	sts, err := d.deploys.Statuses(ctx, ns)
	if err != nil {
		return nil, err
	}
	if len(sts) > 0 {
		v.Latest = &sts[len(sts)-1]
		if v.Phases, err = d.deploys.Phases(ctx, ns, v.Latest.DeployID); err != nil {
			return nil, err
		}
	}
	var sum store.NamespaceStatus
	if st, err := d.s.NamespaceStatusOf(ctx, ns); err == nil {
		sum = *st
	} else if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	if v.Latest != nil {
		if c, ok := sum.Deploys[v.Latest.DeployID]; ok {
			v.Counts = &c
		}
	}
	aside := map[string][]string{}
	for gw, list := range sum.SetAside {
		for _, sa := range list {
			note := gw + ": " + sa.Reason
			if sa.FailOpen {
				note += " (served anyway: the service has no other)"
			}
			aside[sa.Instance] = append(aside[sa.Instance], note)
		}
	}
	err = d.s.ListInstances(ctx, ns+".>", func(_ string, in *store.InstanceRecord) error {
		row := instanceRow{InstanceRecord: *in, Aside: aside[in.ID]}
		slices.Sort(row.Aside)
		v.Instances = append(v.Instances, row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(v.Instances, func(a, b instanceRow) int {
		return cmp.Or(strings.Compare(a.Service, b.Service), cmp.Compare(a.Slot, b.Slot), strings.Compare(a.ID, b.ID))
	})
	for _, svc := range slices.Sorted(maps.Keys(v.Live.Manifest.Services)) {
		for _, rt := range v.Live.Manifest.Services[svc].Routes {
			v.Routes = append(v.Routes, routeRow{Service: svc, Hosts: rt.Hosts, Prefixes: rt.PathPrefixes})
		}
	}
	for _, svc := range slices.Sorted(maps.Keys(sum.Traffic)) {
		t := sum.Traffic[svc]
		st := serviceTraffic{Service: svc, Figures: t.TrafficFigures, Charts: d.history.charts(ns, svc)}
		for _, gw := range slices.Sorted(maps.Keys(t.Gateways)) {
			st.Gateways = append(st.Gateways, gatewayTraffic{Gateway: gw, Figures: t.Gateways[gw]})
		}
		v.Traffic = append(v.Traffic, st)
	}
	// Drains outlive the entry points: a redeploy that stops exposing a
	// port still lets its connections drain, so the reports are read
	// whatever the live commit exposes.
	v.Layer4 = l4Rows(&v.Live.Manifest)
	_, gws, err := fleet.Gateways(ctx, d.s)
	if err != nil {
		return nil, err
	}
	v.L4Errors, v.L4Draining, v.L4ErrorsAll, v.L4DrainsAll = gatewayL4(gws, ns, v.At)
	return v, nil
}

// manifestChanges says what changed from prev to cur, per service and
// field. Values are not shown: an environment may hold secrets, and the
// commit itself is a `control deploy history` away.
func manifestChanges(prev, cur *store.Manifest) []string {
	if prev == nil {
		return []string{"first deploy: " + strings.Join(slices.Sorted(maps.Keys(cur.Services)), ", ")}
	}
	var out []string
	for _, svc := range slices.Sorted(maps.Keys(cur.Services)) {
		old, ok := prev.Services[svc]
		if !ok {
			out = append(out, svc+": added")
			continue
		}
		if f := changedFields(old, cur.Services[svc]); len(f) > 0 {
			out = append(out, svc+": "+strings.Join(f, ", "))
		}
	}
	for _, svc := range slices.Sorted(maps.Keys(prev.Services)) {
		if _, ok := cur.Services[svc]; !ok {
			out = append(out, svc+": removed")
		}
	}
	if len(out) == 0 {
		out = []string{"no change to the manifest"}
	}
	return out
}

// changedFields names the fields of a service spec that differ (env by
// variable name).
func changedFields(a, b store.ServiceSpec) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a.Env)) {
		if nv, ok := b.Env[k]; !ok {
			out = append(out, "env "+k+" removed")
		} else if nv != a.Env[k] {
			out = append(out, "env "+k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b.Env)) {
		if _, ok := a.Env[k]; !ok {
			out = append(out, "env "+k+" added")
		}
	}
	a.Env, b.Env = nil, nil
	am, bm := fieldsOf(a), fieldsOf(b)
	for _, k := range slices.Sorted(maps.Keys(bm)) {
		if am[k] != bm[k] {
			out = append(out, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(am)) {
		if _, ok := bm[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// fieldsOf is a spec's JSON fields, each encoded.
func fieldsOf(s store.ServiceSpec) map[string]string {
	raw, _ := json.Marshal(s)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

type machineData struct {
	pageData
	Machine   store.MachineRecord
	Liveness  string
	LastBeat  time.Time
	Interval  time.Duration
	State     *store.MachineState
	Instances []store.InstanceRecord
	Mesh      *store.MeshHeartbeat
	MeshLive  string
	Direct    int
}

func (d *Server) machine(r *http.Request) (any, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !store.ValidToken(id) {
		return nil, store.Errorf(store.CodeNotFound, "no machine %q", id)
	}
	v := &machineData{pageData: pageData{Title: "machine " + id, Scope: "*", At: time.Now()}}
	rec, err := machines.Get(ctx, d.s, id)
	if err != nil {
		return nil, err
	}
	v.Machine = *rec
	v.Liveness = store.MachineNeverSeen
	if beat, err := d.s.MachineBeatOf(ctx, id); err == nil {
		v.Liveness, v.LastBeat, v.Interval = beat.Liveness(time.Now()), beat.At, time.Duration(beat.Interval)
	} else if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	if st, err := d.s.MachineStateOf(ctx, id); err == nil {
		v.State = st
	} else if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	err = d.s.ListInstances(ctx, "*."+id+".*", func(_ string, in *store.InstanceRecord) error {
		v.Instances = append(v.Instances, *in)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(v.Instances, func(a, b store.InstanceRecord) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Service, b.Service), cmp.Compare(a.Slot, b.Slot))
	})
	if hb, err := d.s.MeshHeartbeatOf(ctx, id); err == nil {
		v.Mesh, v.MeshLive = hb, hb.Liveness(time.Now())
		v.Direct = max(0, hb.PeersActive-hb.PeersRelayed)
	} else if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	return v, nil
}

// Template helpers.
var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return time.Since(t).Round(time.Second).String() + " ago"
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"pct":  func(f float64) string { return strconv.FormatFloat(100*f, 'f', 2, 64) + "%" },
	"rate": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"secs": func(s float64) string {
		if s == 0 {
			return "-"
		}
		return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
	},
	"dur":  func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"join": strings.Join,
	"get":  func(m map[string]int, k string) int { return m[k] },
}
