package caddymodule

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Upstreams is `http.reverse_proxy.upstreams.edgeplane`: a dynamic upstream
// source giving a service's routable instances, for users who write their
// own routes around `reverse_proxy`. With Namespace and Service set it
// always gives that service; otherwise the service routed for the request's
// host and path.
type Upstreams struct {
	// Namespace of the service to proxy to; requires Service. Default: the
	// service routed for the request.
	Namespace string `json:"namespace,omitempty"`
	// Service to proxy to; requires Namespace.
	Service string `json:"service,omitempty"`

	app *App
}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.edgeplane",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// Provision attaches to the edgeplane app.
func (u *Upstreams) Provision(ctx caddy.Context) error {
	app, err := edgeplaneApp(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane upstreams: %w", err)
	}
	u.app = app
	return nil
}

// Validate checks that namespace and service come together.
func (u *Upstreams) Validate() error {
	if (u.Namespace == "") != (u.Service == "") {
		return fmt.Errorf("edgeplane upstreams: namespace and service must be set together (got namespace %q, service %q)", u.Namespace, u.Service)
	}
	return nil
}

// GetUpstreams returns fresh Upstream values for the service's routable
// instances (the reverse proxy writes into them, so they are never shared
// between requests): those of the tier the gateway serves the service
// from. No service, or no tier, means no upstreams.
func (u *Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	v := u.app.Projection().View()
	var svc *projection.Service
	var ok bool
	if u.Service != "" {
		svc, ok = v.Service(u.Namespace, u.Service)
	} else {
		svc, ok = serviceFor(v, r)
	}
	if !ok {
		return nil, nil
	}
	side, split := caddyhttp.GetVar(r.Context(), varSide).(int)
	if !split {
		side = unsplit
	}
	return newUpstreams(u.app.candidates(v, svc, side)), nil
}

// smallUpstreamsN is how many candidates a request's upstreams are made
// for in one allocation (smallUpstreams).
const smallUpstreamsN = 4

// smallUpstreams are the upstreams of a request to a service of up to
// smallUpstreamsN candidates: the values and the slice the proxy reads in
// one allocation.
type smallUpstreams struct {
	ptrs [smallUpstreamsN]*reverseproxy.Upstream
	vals [smallUpstreamsN]reverseproxy.Upstream
}

// newUpstreams is fresh Upstream values dialling dials (already host:port,
// without placeholders, so the proxy's expansion of them finds nothing to
// do).
func newUpstreams(dials []string) []*reverseproxy.Upstream {
	var ups []*reverseproxy.Upstream
	var vals []reverseproxy.Upstream
	if len(dials) <= smallUpstreamsN {
		s := new(smallUpstreams)
		ups, vals = s.ptrs[:len(dials):len(dials)], s.vals[:len(dials)]
	} else {
		ups, vals = make([]*reverseproxy.Upstream, len(dials)), make([]reverseproxy.Upstream, len(dials))
	}
	for i, d := range dials {
		vals[i].Dial = d
		ups[i] = &vals[i]
	}
	return ups
}

// candidates is the one rule, for HTTP requests and layer-4 connections
// alike, of which of svc's endpoints (their dial addresses) a new request
// or connection may go to under v: those of the tier the gateway serves
// the service from, of side when the service is split (side is unsplit
// otherwise; a side with nothing that can serve leaves it to the whole
// tier), with set-aside, fail-open and slow start applied (filter). Nil
// when no tier has an endpoint. The result may be shared: never change it.
func (a *App) candidates(v *projection.View, svc *projection.Service, side int) []string {
	if h := a.home(v); h.regional && !featuresOff.locality.Load() {
		if p := a.plan(v, h, svc); !p.whole {
			t := a.tierFor(v, p)
			if t == nil {
				return nil
			}
			// A side with nothing serving in the tier leaves the request
			// to the whole tier.
			if t.sides != nil && side != unsplit {
				if sd := &t.sides[side]; a.anyServing(v, sd.dials, sd.eps) {
					return a.filter(v, svc, sd.dials, sd.eps)
				}
			}
			return a.filter(v, svc, t.dials, t.eps)
		}
	}
	dials := dialsOf(svc)
	// A split service's request gets the side the handler picked for it.
	if side != unsplit && svc.Split != nil {
		sd := svc.Memo(sidesMemo{}, func(s *projection.Service) any { return splitDials(s, dialsOf(s)) }).(*[2]sideDials)[side]
		// A side none of whose endpoints can serve leaves the request to
		// the whole service rather than failing it open.
		if a.anyServing(v, sd.dials, sd.eps) {
			return a.filter(v, svc, sd.dials, sd.eps)
		}
	}
	return a.filter(v, svc, dials, svc.Endpoints)
}

type sidesMemo struct{}

// sideDials are one side of a split: its endpoints and their dial
// addresses.
type sideDials struct {
	dials []string
	eps   []store.Endpoint
}

// splitDials divides s's dials (one per endpoint) by side, once per
// Service.
func splitDials(s *projection.Service, dials []string) *[2]sideDials {
	var out [2]sideDials
	old, fresh := s.Sides()
	for side, idx := range [2][]int{old, fresh} {
		for _, j := range idx {
			out[side].dials = append(out[side].dials, dials[j])
			out[side].eps = append(out[side].eps, s.Endpoints[j])
		}
	}
	return &out
}

// anyServing reports whether one of dials (of eps) is on a live machine
// and passing its health check.
func (a *App) anyServing(v *projection.View, dials []string, eps []store.Endpoint) bool {
	for i, d := range dials {
		if _, down := v.Down(eps[i].Machine); down {
			continue
		}
		if a.health == nil || !a.health.isDown(d) {
			return true
		}
	}
	return false
}

// filter narrows dials (of eps): instances of machines whose heartbeats
// stopped are set aside while the service has others (fail open), then
// those failing their health checks among what is left, then the
// endpoints ramping up thinned (slowStart).
func (a *App) filter(v *projection.View, svc *projection.Service, dials []string, eps []store.Endpoint) []string {
	if v.AnyDown() {
		live := make([]string, 0, len(dials))
		for i, d := range dials {
			if _, down := v.Down(eps[i].Machine); !down {
				live = append(live, d)
			}
		}
		if len(live) > 0 {
			dials = live
		}
	}
	if a.health != nil {
		dials = a.health.healthy(svc, dials)
	}
	return a.thinRamping(svc, dials)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ caddy.Validator             = (*Upstreams)(nil)
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
)
