package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/caddyserver/caddy/v2/modules/caddytls"
	_ "github.com/caddyserver/caddy/v2/modules/metrics"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const wait = 10 * time.Second

func TestMain(m *testing.M) {
	// Caddy keeps its data and config under HOME/XDG dirs: keep them in a
	// temp dir so tests never touch the machine's.
	dir, err := os.MkdirTemp("", "edgeplane-caddymodule-")
	if err != nil {
		panic(err)
	}
	for _, k := range []string{"HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"} {
		os.Setenv(k, dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr reserves a loopback address for a listener started later.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// backend is a real HTTP server on loopback that names itself in every
// response.
type backend struct {
	name string
	srv  *httptest.Server
	host string
	port int
}

func newBackend(t testing.TB, name string) *backend {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", name)
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return &backend{name: name, srv: srv, host: host, port: port}
}

func (b *backend) instance() storetest.Instance {
	return storetest.Instance{ID: b.name, Machine: "m1", Address: b.host, Port: b.port}
}

func svc(hosts []string, prefixes []string, bs ...*backend) storetest.Service {
	s := storetest.Service{Routes: []store.Route{{Hosts: hosts, PathPrefixes: prefixes}}}
	for _, b := range bs {
		s.Instances = append(s.Instances, b.instance())
	}
	return s
}

// fixture is a real NATS server, and a real Caddy loaded in this process
// with the edgeplane app, a gateway server and the admin API on loopback.
type fixture struct {
	t       testing.TB
	nats    *storetest.Server
	natsURL string
	// creds, if set, are the gateway's credentials (a node with auth).
	creds   string
	gateway string // host:port of the gateway server
	admin   string // host:port of the admin API
	snap    string
	client  *http.Client
	// handler is extra JSON fields of the edgeplane handler, app of the
	// edgeplane app.
	handler map[string]any
	app     map[string]any
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, storetest.Start(t))
}

// newFixtureOn is newFixture on a server of the caller's.
func newFixtureOn(t testing.TB, srv *storetest.Server) *fixture {
	t.Helper()
	f := &fixture{t: t, nats: srv, snap: filepath.Join(t.TempDir(), "snap", "routing.json"),
		gateway: freeAddr(t), admin: freeAddr(t)}
	f.natsURL = f.nats.URL
	f.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

// config is the Caddy JSON config of the fixture.
func (f *fixture) config() []byte {
	h := map[string]any{"handler": "edgeplane"}
	for k, v := range f.handler {
		h[k] = v
	}
	app := map[string]any{"nats_url": f.natsURL, "creds_file": f.creds, "snapshot_path": f.snap, "gateway_name": "gw-test"}
	for k, v := range f.app {
		app[k] = v
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": f.admin},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{
			"edgeplane": app,
			"http": map[string]any{"servers": map[string]any{"gateway": map[string]any{
				"listen":          []string{f.gateway},
				"routes":          []any{map[string]any{"handle": []any{h}}},
				"automatic_https": map[string]any{"disable": true},
			}}},
		},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// load (re)loads the fixture's config into the process's Caddy.
func (f *fixture) load() {
	f.t.Helper()
	loadCaddy(f.t, f.config())
}

var stopOnce sync.Map

func loadCaddy(t testing.TB, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading caddy config: %v", err)
	}
	if _, loaded := stopOnce.LoadOrStore(t, true); !loaded {
		t.Cleanup(func() {
			if err := caddy.Stop(); err != nil {
				t.Logf("stopping caddy: %v", err)
			}
		})
	}
}

func (f *fixture) proj() *projection.Projection {
	a := current.Load()
	if a == nil {
		f.t.Fatal("no edgeplane app running")
	}
	return a.Projection()
}

func (f *fixture) waitSeq(seq uint64) {
	f.t.Helper()
	storetest.Eventually(f.t, wait, fmt.Sprintf("gateway to apply routing seq %d", seq), func() bool {
		a := current.Load()
		return a != nil && a.Projection().View().Seq >= seq
	})
}

func (f *fixture) deploy(ns string, services map[string]storetest.Service) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, seq, err := storetest.Deploy(ctx, f.nats.Store, ns, services)
	if err != nil {
		f.t.Fatalf("deploying %s: %v", ns, err)
	}
	return seq
}

type reply struct {
	status  int
	body    string
	backend string
}

// get sends GET path with Host host through the gateway.
func (f *fixture) get(host, path string) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+f.gateway+path, nil)
	if err != nil {
		return reply{}, err
	}
	req.Host = host
	resp, err := f.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, body: string(b), backend: resp.Header.Get("X-Backend")}, nil
}

func (f *fixture) mustGet(host, path string) reply {
	f.t.Helper()
	r, err := f.get(host, path)
	if err != nil {
		f.t.Fatalf("GET %s%s: %v", host, path, err)
	}
	return r
}

// adminGet reads an admin API path.
func (f *fixture) adminGet(path string) (int, []byte) {
	f.t.Helper()
	resp, err := f.client.Get("http://" + f.admin + path)
	if err != nil {
		f.t.Fatalf("admin GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// load runs requests from workers until stop is closed and counts failures:
// anything but a 200 from one of the wanted backends.
type loadGen struct {
	ok, failed int64
	firstErr   string
	mu         sync.Mutex
	stop       chan struct{}
	wg         sync.WaitGroup
}

func (f *fixture) startLoad(host string, workers int) *loadGen {
	lg := &loadGen{stop: make(chan struct{})}
	for i := 0; i < workers; i++ {
		lg.wg.Add(1)
		go func() {
			defer lg.wg.Done()
			for {
				select {
				case <-lg.stop:
					return
				default:
				}
				r, err := f.get(host, "/")
				lg.mu.Lock()
				if err != nil || r.status != http.StatusOK {
					lg.failed++
					if lg.firstErr == "" {
						lg.firstErr = fmt.Sprintf("status %d body %q err %v", r.status, r.body, err)
					}
				} else {
					lg.ok++
				}
				lg.mu.Unlock()
			}
		}()
	}
	return lg
}

func (lg *loadGen) finish() (ok, failed int64, first string) {
	close(lg.stop)
	lg.wg.Wait()
	return lg.ok, lg.failed, lg.firstErr
}

func splitHostPort(t testing.TB, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
