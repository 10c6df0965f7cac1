package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// gatewayState is what one gateway says it serves, from its report in the
// store or its admin API.
type gatewayState struct {
	name, source string
	appliedSeq   uint64
	stale        bool
	connected    bool
	digest       string
	conflicts    []string
	at           time.Time
	// routes, read from the admin API only, is what it serves per
	// service.
	routes map[string][]string
}

// checkGateways compares what each gateway serves with the routing the
// store derives: the sequence it applied, and at the same sequence the
// digest of every host's routes and upstreams.
func (d *doctor) checkGateways(ctx context.Context) error {
	var gws []gatewayState
	seen := map[string]bool{}
	// The admin API first: it answers even for a gateway cut off from
	// NATS, and it is fresher than a report.
	for _, url := range d.o.Gateways {
		g, err := d.readAdmin(ctx, url)
		if err != nil {
			d.add(LayerGateways, Problem, "gateway "+url, "admin API unreadable: %v", err)
			continue
		}
		seen[g.name] = true
		gws = append(gws, *g)
	}
	err := d.s.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
		if seen[o.Gateway] || d.now.Sub(o.At) >= store.GatewayObservationTTL {
			return nil
		}
		gws = append(gws, gatewayState{name: o.Gateway, source: "its report", appliedSeq: o.AppliedSeq, stale: o.Stale,
			connected: true, digest: o.Digest, conflicts: o.Conflicts, at: o.At})
		return nil
	})
	if err != nil {
		return err
	}
	d.checked(LayerGateways, len(gws))
	for _, g := range gws {
		d.judgeGateway(ctx, g)
	}
	return nil
}

func (d *doctor) judgeGateway(ctx context.Context, g gatewayState) {
	subj := "gateway " + g.name
	want := d.view
	for _, c := range g.conflicts {
		if isLayer4Conflict(c) {
			d.add(LayerGateways, Problem, subj, "serves a gateway port or passthrough host two services expose: %s", c)
			continue
		}
		d.add(LayerGateways, Problem, subj, "serves a host two namespaces route: %s", c)
	}
	switch {
	case g.appliedSeq > want.Seq:
		// Events arrived after the doctor read the routing: compare with
		// the state at the gateway's sequence only if it is the head.
		rs, err := d.s.LoadRouting(ctx)
		if err != nil || rs.Seq != g.appliedSeq {
			d.add(LayerGateways, Note, subj, "at sequence %d, ahead of the doctor's read (%d): routing is changing; run again", g.appliedSeq, want.Seq)
			return
		}
		want, _ = projection.FromState(rs)
	case g.appliedSeq < want.Seq:
		// Behind only if the event it lacks was stored before it spoke.
		if msg, err := d.s.RoutingMsg(ctx, g.appliedSeq+1); err == nil && !g.at.IsZero() && g.at.Sub(msg.Time) < time.Second {
			d.add(LayerGateways, Note, subj, "at sequence %d of %d as of %s, just behind a new event", g.appliedSeq, want.Seq, g.at.Format("15:04:05"))
			return
		} else if err != nil && err != jetstream.ErrMsgNotFound {
			d.add(LayerGateways, Note, subj, "at sequence %d of %d (the next event is unreadable: %v)", g.appliedSeq, want.Seq, err)
			return
		}
		what := "serves routing"
		if g.stale {
			what = "serves a stale view"
		}
		if !g.connected {
			what += " while disconnected from NATS"
		}
		d.add(LayerGateways, Problem, subj, "%s at sequence %d, the store is at %d (%s)%s", what, g.appliedSeq, want.Seq, g.source, d.routeDiff(g, want))
		return
	}
	switch {
	case g.digest == "":
		d.add(LayerGateways, Note, subj, "reports no digest (an older gateway): only its sequence was checked")
	case g.digest != want.Digest():
		d.add(LayerGateways, Problem, subj, "at sequence %d serves other routes or upstreams than the store derives (digest %s, want %s)%s",
			g.appliedSeq, g.digest, want.Digest(), d.routeDiff(g, want))
	case g.stale:
		d.add(LayerGateways, Problem, subj, "flags its view as stale though it matches the store (%s)", g.source)
	}
}

// routeDiff names the services whose upstreams a gateway (read through its
// admin API) serves differently, for the message.
func (d *doctor) routeDiff(g gatewayState, want *projection.View) string {
	if g.routes == nil {
		return ""
	}
	var diffs []string
	for _, svc := range want.Services() {
		var eps []string
		for _, ep := range svc.Endpoints {
			eps = append(eps, fmt.Sprintf("%s:%d", ep.Address, ep.Port))
		}
		sort.Strings(eps)
		got, ok := g.routes[svc.Key()]
		switch {
		case !ok:
			diffs = append(diffs, svc.Key()+" missing")
		case !slices.Equal(got, eps):
			diffs = append(diffs, fmt.Sprintf("%s upstreams [%s], want [%s]", svc.Key(), strings.Join(got, " "), strings.Join(eps, " ")))
		}
	}
	for key := range g.routes {
		ns, name, _ := strings.Cut(key, "/")
		if _, ok := want.Service(ns, name); !ok {
			diffs = append(diffs, key+" routed, should not be")
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	sort.Strings(diffs)
	return ": " + strings.Join(diffs, "; ")
}

// readAdmin reads a gateway's projection status and routes through Caddy's
// admin API.
func (d *doctor) readAdmin(ctx context.Context, base string) (*gatewayState, error) {
	base = strings.TrimSuffix(base, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	var st projection.Status
	if err := d.getJSON(ctx, base+"/edgeplane/projection", &st); err != nil {
		return nil, err
	}
	var routes []struct {
		Namespace string           `json:"namespace"`
		Service   string           `json:"service"`
		Endpoints []store.Endpoint `json:"endpoints"`
	}
	if err := d.getJSON(ctx, base+"/edgeplane/routes", &routes); err != nil {
		return nil, err
	}
	g := &gatewayState{name: st.Gateway, source: "admin API " + base, appliedSeq: st.AppliedSeq, stale: st.Stale,
		connected: st.Connected, digest: st.Digest, at: d.now, routes: map[string][]string{}}
	if g.name == "" {
		g.name = base
	}
	for _, c := range st.HostConflicts {
		g.conflicts = append(g.conflicts, fmt.Sprintf("%s: %s over %s", c.Host, c.Owner, strings.Join(c.Others, ", ")))
	}
	for _, r := range routes {
		eps := []string{}
		for _, ep := range r.Endpoints {
			eps = append(eps, fmt.Sprintf("%s:%d", ep.Address, ep.Port))
		}
		sort.Strings(eps)
		g.routes[r.Namespace+"/"+r.Service] = eps
	}
	return g, nil
}

func (d *doctor) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := d.o.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// maxDNSNames bounds the names asked of each DNS server.
const maxDNSNames = 500

// checkDNS asks each DNS server for the zone's serial (the routing sequence
// it answers from) and for every service's and machine's addresses.
func (d *doctor) checkDNS(ctx context.Context) error {
	type name struct {
		fqdn, subject string
		want          []string
	}
	var names []name
	for _, svc := range d.view.Services() {
		var ips []string
		for _, ep := range svc.Endpoints {
			if ip, err := netip.ParseAddr(ep.Address); err == nil && ip.Is4() && !slices.Contains(ips, ip.String()) {
				ips = append(ips, ip.String())
			}
		}
		sort.Strings(ips)
		names = append(names, name{strings.ToLower(svc.Name + "." + svc.Namespace + "." + d.o.Zone), svc.Key(), ips})
	}
	for _, m := range d.view.Machines() {
		ip, err := netip.ParseAddr(m.Address)
		if err != nil || !ip.Is4() {
			continue
		}
		names = append(names, name{strings.ToLower(m.ID + ".machines." + d.o.Zone), "machine " + m.ID, []string{ip.String()}})
	}
	if len(names) > maxDNSNames {
		d.add(LayerDNS, Note, "dns", "checking the first %d of %d names", maxDNSNames, len(names))
		names = names[:maxDNSNames]
	}
	var wg sync.WaitGroup
	for _, server := range d.o.DNS {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Timeout: d.o.ProbeTimeout}
			ask := func(q string, t uint16) (*dns.Msg, error) {
				m := new(dns.Msg)
				m.SetQuestion(q, t)
				r, _, err := c.ExchangeContext(ctx, m, server)
				return r, err
			}
			subj := "dns " + server
			soa, err := ask(d.o.Zone, dns.TypeSOA)
			if err != nil {
				d.add(LayerDNS, Problem, subj, "does not answer: %v", err)
				return
			}
			var serial uint32
			for _, rr := range soa.Answer {
				if s, ok := rr.(*dns.SOA); ok {
					serial = s.Serial
				}
			}
			if serial != uint32(d.view.Seq) {
				d.add(LayerDNS, Problem, subj, "answers %s from routing sequence %d, the store is at %d", d.o.Zone, serial, uint32(d.view.Seq))
			}
			for _, n := range names {
				r, err := ask(n.fqdn, dns.TypeA)
				if err != nil {
					d.add(LayerDNS, Problem, subj, "%s: %v", n.fqdn, err)
					continue
				}
				got := []string{}
				for _, rr := range r.Answer {
					if a, ok := rr.(*dns.A); ok && !slices.Contains(got, a.A.String()) {
						got = append(got, a.A.String())
					}
				}
				sort.Strings(got)
				if !slices.Equal(got, n.want) {
					d.add(LayerDNS, Problem, subj, "%s (%s) answers [%s], want [%s]", n.fqdn, n.subject, strings.Join(got, " "), strings.Join(n.want, " "))
				}
			}
			d.checked(LayerDNS, len(names))
		}()
	}
	wg.Wait()
	return nil
}
