// Package dashboard is the control plane's read-only web dashboard: the
// fleet at a glance, a namespace (deploy history and what changed, the
// latest deploy's phases, instances and their health as every gateway
// sees it, routes, traffic over the last hour), and a machine (its
// instances, heartbeat, mesh paths). Pages are rendered on the server
// with html/template, which escapes every name a role can influence; a
// few lines of vanilla JavaScript, embedded like the rest, refresh the
// page's body when the store says it changed (server-sent events fed by
// KV watches). No JavaScript library and no build step.
//
// On a loopback address the dashboard is open, and answers only requests
// that name it by a loopback Host (localhost, 127.0.0.1, [::1]): a page
// the operator visits cannot reach it through a name of its own that
// points here (DNS rebinding). Anywhere else, or with a login asked for,
// every page needs a login with a token made by `control dashboard
// token`. A login exchanges the token for a session (store.DashboardSession):
// the cookie (HttpOnly, SameSite=Strict, Secure unless the browser talks
// to loopback) holds the session's random ID, never the token; the
// session is checked against the store on every request, with its expiry
// and its token, so a revoked token's sessions stop at once, and an open
// event stream checks again every SessionRecheck and ends.
package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/store"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config says how to serve.
type Config struct {
	// RequireLogin asks for a token on every page. RequiresLogin(listen)
	// is the default a server applies: everywhere but loopback.
	RequireLogin bool
	// DoctorEvery is how often the overview's `control doctor` findings
	// are refreshed; default 30s, negative: never run.
	DoctorEvery time.Duration
	// SessionTTL is how long a login lasts; default DefaultSessionTTL.
	SessionTTL time.Duration
	// SessionRecheck is how often an open event stream checks its
	// session again; default DefaultSessionRecheck.
	SessionRecheck time.Duration
	// ChartStep is how much time a point of the traffic charts stands
	// for; default DefaultChartStep.
	ChartStep time.Duration
	Logger    *zap.Logger
}

// RequiresLogin reports whether a dashboard listening on addr must ask
// for a login: anything but a loopback address (a wildcard, an interface
// address, a name other than localhost) may be reached by others.
func RequiresLogin(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// Server serves the dashboard for one store.
type Server struct {
	s   *store.Store
	cfg Config
	log *zap.Logger
	mux *http.ServeMux
	// deploys reads deploy history, statuses and phases.
	deploys *deploy.Deployer

	pages map[string]*template.Template

	hub     hub
	history history
	doctor  atomic.Pointer[doctor.Report]
	cache   readCache
}

// New makes a dashboard over s. Run feeds its live parts.
func New(s *store.Store, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.DoctorEvery == 0 {
		cfg.DoctorEvery = 30 * time.Second
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.SessionRecheck <= 0 {
		cfg.SessionRecheck = DefaultSessionRecheck
	}
	d := &Server{s: s, cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), pages: map[string]*template.Template{},
		deploys: deploy.New(s, deploy.Options{})}
	d.history.step = cfg.ChartStep
	base, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/layer4.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard templates: %w", err)
	}
	for _, page := range []string{"overview", "machines", "namespace", "machine", "login", "error"} {
		t, err := template.Must(base.Clone()).ParseFS(assets, "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard template %s: %w", page, err)
		}
		d.pages[page] = t
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	d.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	d.mux.HandleFunc("GET /login", d.loginPage)
	d.mux.HandleFunc("POST /login", d.login)
	d.mux.HandleFunc("POST /logout", d.logout)
	d.mux.Handle("GET /{$}", d.page("overview", d.overview))
	d.mux.Handle("GET /machines", d.page("machines", d.machines))
	d.mux.Handle("GET /ns/{ns}", d.page("namespace", d.namespace))
	d.mux.Handle("GET /machine/{id}", d.page("machine", d.machine))
	d.mux.HandleFunc("GET /events", d.events)
	return d, nil
}

// ServeHTTP serves the dashboard: security headers on every answer, the
// login on every page but the login page and the assets.
func (d *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Nothing inline runs, even if something slipped past the escaping.
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: with no referrer a browser sends its
	// form posts with "Origin: null", and the login checks the origin.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	if !d.cfg.RequireLogin && !loopbackHost(r.Host) {
		// Open without a login, the dashboard is for this box alone: a
		// browser sends another Host only when a name it looked up (an
		// attacker's, rebound to 127.0.0.1) led it here.
		d.log.Warn("dashboard request for another host refused", zap.String("host", r.Host), zap.String("remote", r.RemoteAddr))
		http.Error(w, "this dashboard listens on loopback without a login and answers to localhost, 127.0.0.1 or [::1] only: "+
			"a request naming another host is refused (a page reaching it through DNS rebinding). "+
			"To serve it under another name (a TLS proxy), start it with --dashboard-login", http.StatusMisdirectedRequest)
		return
	}
	if d.cfg.RequireLogin && r.URL.Path != "/login" && !strings.HasPrefix(r.URL.Path, "/static/") {
		if _, err := d.session(r); err != nil {
			if r.URL.Path == "/events" || r.Header.Get("X-Fragment") != "" {
				http.Error(w, "login required", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
	}
	d.mux.ServeHTTP(w, r)
}

// Run feeds the live parts until ctx ends: change events for open pages,
// the traffic history, and the doctor's findings.
func (d *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.watchLoop(ctx) }()
	go func() { defer wg.Done(); d.doctorLoop(ctx) }()
	wg.Wait()
}

// watchLoop follows the fleet status, deploy status and phase buckets,
// telling open pages of the namespace that changed, and samples the
// traffic history; it starts the watches again after a failure.
func (d *Server) watchLoop(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		err := d.watch(ctx, tick.C)
		if ctx.Err() != nil {
			return
		}
		d.log.Warn("dashboard watches ended; starting again", zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (d *Server) watch(ctx context.Context, tick <-chan time.Time) error {
	var ws []jetstream.KeyWatcher
	defer func() {
		for _, w := range ws {
			_ = w.Stop()
		}
	}()
	for _, b := range []struct {
		bucket string
		watch  func(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
	}{
		{d.s.Names.FleetStatusBucket(), d.s.WatchNamespaceStatus},
		{d.s.Names.DeployStatusBucket(), d.s.WatchDeployStatus},
		{d.s.Names.DeployPhasesBucket(), d.s.WatchPhases},
	} {
		w, err := b.watch(ctx)
		if err != nil {
			return store.Classify(fmt.Errorf("watching %s: %w", b.bucket, err))
		}
		ws = append(ws, w)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			// Ages and heartbeats move with time alone.
			d.hub.send("*")
		case ent, ok := <-ws[0].Updates():
			if !ok {
				return errors.New("fleet status watch ended")
			}
			if ent != nil {
				d.fleetStatus(ent)
			}
		case ent, ok := <-ws[1].Updates():
			if !ok {
				return errors.New("deploy status watch ended")
			}
			if ent != nil {
				d.hub.send(namespaceOf(ent.Key()))
			}
		case ent, ok := <-ws[2].Updates():
			if !ok {
				return errors.New("phase watch ended")
			}
			if ent != nil {
				d.hub.send(namespaceOf(ent.Key()))
			}
		}
	}
}

// namespaceOf is the namespace a status or phase key starts with.
func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, ".")
	return ns
}

// fleetStatus takes in a namespace summary: its traffic goes into the
// history, and open pages hear of it.
func (d *Server) fleetStatus(ent jetstream.KeyValueEntry) {
	if ent.Operation() == jetstream.KeyValuePut {
		var st store.NamespaceStatus
		if err := store.DecodeKeyed(d.s.Names.FleetStatusBucket(), ent.Key(), ent.Value(), &st); err == nil {
			d.history.add(st.Namespace, st.Traffic, st.UpdatedAt)
		}
	}
	d.cache.forget()
	d.hub.send(ent.Key())
}

// doctorLoop keeps the overview's doctor findings fresh.
func (d *Server) doctorLoop(ctx context.Context) {
	if d.cfg.DoctorEvery < 0 {
		return
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		rep, err := doctor.Run(dctx, d.s, doctor.Options{})
		cancel()
		if err != nil && ctx.Err() == nil {
			d.log.Warn("dashboard doctor run", zap.Error(err))
		} else if rep != nil {
			d.doctor.Store(rep)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.cfg.DoctorEvery):
		}
	}
}

// hub fans change events out to the open pages.
type hub struct {
	mu   sync.Mutex
	subs map[chan string]struct{}
}

func (h *hub) subscribe() (<-chan string, func()) {
	ch := make(chan string, 64)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[chan string]struct{}{}
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

// send tells every page what changed: a namespace, or "*" for anything;
// a page too slow to take it misses it (the next one refreshes it anyway).
func (h *hub) send(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- what:
		default:
		}
	}
}

// events streams change events to a page (server-sent events).
func (d *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	ch, stop := d.hub.subscribe()
	defer stop()
	// A stream outlives the check its request passed: it checks its
	// session again (expiry, token revoked) and ends when that fails.
	var recheck <-chan time.Time
	if d.cfg.RequireLogin {
		t := time.NewTicker(d.cfg.SessionRecheck)
		defer t.Stop()
		recheck = t.C
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-recheck:
			if _, err := d.session(r); err != nil {
				if !store.HasCode(err, store.CodeUnauthorized) {
					// The store could not say: the stream ends all the
					// same, and the page's reconnect asks again.
					d.log.Warn("dashboard event stream: checking its session", zap.Error(err))
				}
				_, _ = fmt.Fprint(w, "event: logout\ndata: session ended\n\n")
				_ = rc.Flush()
				return
			}
		case what := <-ch:
			// Names are tokens (no newline can reach the stream), but the
			// data line is cut at one anyway.
			what, _, _ = strings.Cut(what, "\n")
			if _, err := fmt.Fprintf(w, "data: %s\n\n", what); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}

// Serve serves d on addr until ctx ends; the returned func waits for the
// server's end (requests in flight get five seconds).
func Serve(ctx context.Context, addr string, d *Server) (url string, wait func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("dashboard on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return "http://" + l.Addr().String() + "/", func() { <-done }, nil
}
