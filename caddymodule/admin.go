package caddymodule

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is `admin.api.edgeplane`: read-only endpoints on Caddy's admin API
// showing the gateway's routing projection.
//
//	GET /edgeplane/projection   status: applied sequence, stream head, lag,
//	                            last event age, rebuilds, connected or stale,
//	                            the gateway's region and where it came from
//	GET /edgeplane/routes       every service with its routes and endpoints,
//	                            and the endpoints set aside by health checks
//	GET /edgeplane/hosts/<host> the routes of one host ("*.suffix" for a
//	                            wildcard) and what "/" resolves to
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.edgeplane",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/edgeplane/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// RouteInfo is one service in /edgeplane/routes.
type RouteInfo struct {
	Namespace string           `json:"namespace"`
	Service   string           `json:"service"`
	DeployID  string           `json:"deploy_id"`
	Revision  int64            `json:"revision"`
	Routes    []store.Route    `json:"routes"`
	Endpoints []store.Endpoint `json:"endpoints"`
	// SetAside are the endpoints that get no new requests, and why.
	SetAside []SetAsideInfo `json:"set_aside,omitempty"`
	// FailOpen is set when every endpoint is set aside: they are all
	// served anyway.
	FailOpen bool `json:"fail_open,omitempty"`
	// Serving, when the service's endpoints are in more than one tier for
	// this gateway (projection.View.Tiers), is the tier it serves from
	// now; Unavailable says why it has none.
	Serving     *ServingInfo `json:"serving,omitempty"`
	Unavailable string       `json:"unavailable,omitempty"`
	// SlowStart maps each instance ramping up (slow start) to the share
	// of a full share it gets now.
	SlowStart map[string]float64 `json:"slow_start,omitempty"`
	// Layer4 lists the gateway ports and passthrough hosts that reach the
	// service, with the connections open to each instance.
	Layer4 []L4EntryInfo `json:"layer4,omitempty"`
	// Maintenance, when set, is the record that puts the service under
	// maintenance: the gateway answers its routes 503 itself.
	Maintenance *store.MaintenanceRecord `json:"maintenance,omitempty"`
}

// ServingInfo is the tier of a service's endpoints the gateway serves
// from: their region ("" for several, under locality any), its state, and
// the instances.
type ServingInfo struct {
	Region    string   `json:"region"`
	State     string   `json:"state"`
	Instances []string `json:"instances"`
}

// GatewayStatus is the answer of /edgeplane/projection: the projection's
// status and the gateway's region.
type GatewayStatus struct {
	projection.Status
	// Region is the region the gateway serves from first ("" for none),
	// and RegionSource where it came from: "config" (the app's region),
	// "machine" (the region of the machine named as the gateway) or
	// "none".
	Region       string `json:"region,omitempty"`
	RegionSource string `json:"region_source"`
	// RegionRTTMillis is the round trip to each other region the gateway
	// measured (the median of its last connects), in milliseconds.
	RegionRTTMillis map[string]float64 `json:"region_rtt_ms,omitempty"`
	// L4Ports maps each layer-4 port the gateway has open to its service;
	// L4Errors are the ports it could not open, and why.
	L4Ports  map[string]string   `json:"l4_ports,omitempty"`
	L4Errors []store.L4PortError `json:"l4_errors,omitempty"`
}

// SetAsideInfo is one endpoint the gateway sends no new requests to.
type SetAsideInfo struct {
	InstanceID string    `json:"instance_id"`
	Machine    string    `json:"machine"`
	Reason     string    `json:"reason"`
	Since      time.Time `json:"since"`
}

// HostInfo is the answer of /edgeplane/hosts/<host>.
type HostInfo struct {
	Host   string                 `json:"host"`
	Routes []projection.HostRoute `json:"routes"`
	// Root is what a request for "/" on this host reaches, if anything.
	Root *RouteInfo `json:"root,omitempty"`
}

func routeInfo(app *App, v *projection.View, s *projection.Service) RouteInfo {
	eps := s.Endpoints
	if eps == nil {
		eps = []store.Endpoint{}
	}
	ri := RouteInfo{Namespace: s.Namespace, Service: s.Name, DeployID: s.DeployID, Revision: s.Revision,
		Routes: s.Routes, Endpoints: eps}
	for _, e := range eps {
		if d, down := v.Down(e.Machine); down {
			ri.SetAside = append(ri.SetAside, SetAsideInfo{InstanceID: e.InstanceID, Machine: e.Machine, Since: d.LastBeat,
				Reason: fmt.Sprintf("machine %s is %s: no heartbeat since %s (every %s)", e.Machine, d.Liveness, d.LastBeat.UTC().Format(time.RFC3339), d.Interval)})
			continue
		}
		if app.health == nil {
			continue
		}
		if sa, ok := app.health.setAsideOf(net.JoinHostPort(e.Address, strconv.Itoa(e.Port))); ok {
			ri.SetAside = append(ri.SetAside, SetAsideInfo{InstanceID: e.InstanceID, Machine: e.Machine, Reason: sa.Reason, Since: sa.Since})
		}
	}
	ri.FailOpen = len(eps) > 0 && len(ri.SetAside) == len(eps)
	if rec, on := v.Maintenance(s.Namespace, s.Name); on {
		ri.Maintenance = &rec
	}
	if ramping := app.shared.slow.rampingNow(); ramping != nil {
		for _, e := range eps {
			if f, ok := ramping[net.JoinHostPort(e.Address, strconv.Itoa(e.Port))]; ok {
				if ri.SlowStart == nil {
					ri.SlowStart = map[string]float64{}
				}
				ri.SlowStart[e.InstanceID] = f
			}
		}
	}
	if h := app.home(v); h.regional {
		p := app.plan(v, h, s)
		ri.Unavailable = strings.TrimSuffix(p.unavailable, "\n")
		if t := app.tierFor(v, p); !p.whole && t != nil {
			ri.Serving = &ServingInfo{Region: t.region, State: t.state, Instances: make([]string, 0, len(t.eps))}
			for _, e := range t.eps {
				ri.Serving.Instances = append(ri.Serving.Instances, e.InstanceID)
			}
		}
	}
	ri.Layer4 = l4Info(app, v, s)
	return ri
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	app := current.Load()
	if app == nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("the edgeplane app is not running")}
	}
	p := app.Projection()
	path := strings.TrimPrefix(r.URL.Path, "/edgeplane/")
	var body any
	switch {
	case path == "projection":
		h := app.home(p.View())
		body = GatewayStatus{Status: p.Status(), Region: h.region, RegionSource: h.source, RegionRTTMillis: rttMillis(app.rtt.snapshot()),
			L4Ports: app.shared.ports.openPorts(), L4Errors: app.shared.ports.errors()}
	case path == "routes":
		v := p.View()
		svcs := v.Services()
		out := make([]RouteInfo, 0, len(svcs))
		for _, s := range svcs {
			out = append(out, routeInfo(app, v, s))
		}
		body = out
	case strings.HasPrefix(path, "hosts/") && len(path) > len("hosts/"):
		host := strings.TrimPrefix(path, "hosts/")
		v := p.View()
		info := HostInfo{Host: host, Routes: v.HostRoutes(host)}
		if !strings.HasPrefix(host, "*.") {
			if s, ok := v.Lookup(host, "/"); ok {
				ri := routeInfo(app, v, s)
				info.Root = &ri
			}
		}
		if len(info.Routes) == 0 && info.Root == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no route for host %q", host)}
		}
		body = info
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("unknown edgeplane endpoint %q (try /edgeplane/projection, /edgeplane/routes, /edgeplane/hosts/<host>)", r.URL.Path)}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(body)
}

// Interface guards
var (
	_ caddy.AdminRouter = Admin{}
)
