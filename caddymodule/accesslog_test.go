package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/logging"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// echoIDsBackend answers with the request ID and traceparent it received.
func echoIDsBackend(t *testing.T, id string) storetest.Instance {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "rid=%s tp=%s", r.Header.Get("X-Request-ID"), r.Header.Get("Traceparent"))
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: id, Machine: "m1", Address: host, Port: port}
}

// loadWithAccessFile loads f with the "edgeplane.access" logger written
// to a file of its own, as an operator's logging config would; it
// returns the file's path.
func loadWithAccessFile(t testing.TB, f *fixture) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "access.log")
	var cfg map[string]any
	if err := json.Unmarshal(f.config(), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["logging"] = map[string]any{"logs": map[string]any{
		"default": map[string]any{"level": "ERROR", "exclude": []string{"edgeplane.access"}},
		"access": map[string]any{"level": "INFO", "include": []string{"edgeplane.access"},
			"writer": map[string]any{"output": "file", "filename": path}, "encoder": map[string]any{"format": "json"}},
	}}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, b)
	return path
}

// accessLines reads the access log file's lines by request ID.
func accessLines(t *testing.T, path string) (map[string]map[string]any, string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access line %q: %v", l, err)
		}
		if id, _ := m["request_id"].(string); id != "" {
			out[id] = m
		}
	}
	return out, string(raw)
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Request IDs through a real gateway: created when the client sent none
// (or an unusable one), passed through otherwise, with a traceparent
// likewise, all seen by the instance; the response carries the ID back.
// Every request writes one JSON access line with its fields to the
// "edgeplane.access" logger and publishes it on its access subject;
// Authorization, Cookie and the query string never appear unless the
// route asks; a route with access_log off writes none.
func TestAccessLogThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	path := loadWithAccessFile(t, f)
	in := echoIDsBackend(t, "web-1")
	sub, err := f.nats.Store.NC.SubscribeSync(f.nats.Store.Names.AccessWildcard("shop", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{in},
		Routes: []store.Route{
			{Hosts: []string{"plain.example"}},
			{Hosts: []string{"logged.example"}, AccessLog: &store.AccessLogPolicy{Query: true, Headers: []string{"x-tenant", "Authorization"}}},
			{Hosts: []string{"quiet.example"}, AccessLog: &store.AccessLogPolicy{Off: true}},
			{Hosts: []string{"strip.example"}, PathPrefixes: []string{"/api"}, StripPrefix: true},
		},
	}}))
	do := func(host, target string, h http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+f.gateway+target, nil)
		req.Host = host
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, readAll(t, resp))
		return resp, b.String()
	}
	secrets := http.Header{"Authorization": {"Bearer s3cret-token"}, "Cookie": {"sid=c00kie-value"}}

	// No ID sent: one is made, and a traceparent.
	resp, body := do("plain.example", "/a/b?token=qu3ry-secret", secrets)
	made := resp.Header.Get("X-Request-ID")
	if !hexID.MatchString(made) {
		t.Fatalf("made request ID %q: want 32 hex digits", made)
	}
	var seenID, seenTP string
	if _, err := fmt.Sscanf(body, "rid=%s tp=%s", &seenID, &seenTP); err != nil || seenID != made || !validTraceparent(seenTP) {
		t.Fatalf("the instance saw %q (want rid=%s and a valid traceparent)", body, made)
	}
	// Sane ones sent: passed through.
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, body = do("plain.example", "/c", http.Header{"X-Request-Id": {"client-id-1"}, "Traceparent": {tp}})
	if resp.Header.Get("X-Request-ID") != "client-id-1" || body != "rid=client-id-1 tp="+tp {
		t.Fatalf("passed through: response ID %q, instance saw %q", resp.Header.Get("X-Request-ID"), body)
	}
	// Unusable ones: replaced.
	resp, body = do("plain.example", "/d", http.Header{"X-Request-Id": {"has space<script>"}, "Traceparent": {"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}})
	replaced := resp.Header.Get("X-Request-ID")
	if !hexID.MatchString(replaced) || strings.Contains(body, "00000000000000000000000000000000") || !strings.HasPrefix(body, "rid="+replaced+" tp=00-") {
		t.Fatalf("replaced: response ID %q, instance saw %q", replaced, body)
	}
	// A route that asks for the query and headers; one that logs nothing.
	logged, _ := do("logged.example", "/e?page=2", http.Header{"X-Tenant": {"acme"}, "Authorization": {"Basic bG9nZ2Vk"}, "Cookie": {"sid=c00kie-value"}})
	loggedID := logged.Header.Get("X-Request-ID")
	stripped, _ := do("strip.example", "/api/g", nil)
	strippedID := stripped.Header.Get("X-Request-ID")
	quiet, _ := do("quiet.example", "/f", nil)
	quietID := quiet.Header.Get("X-Request-ID")
	if !hexID.MatchString(quietID) {
		t.Fatalf("a route with access_log off still sets request IDs: got %q", quietID)
	}

	var lines map[string]map[string]any
	var raw string
	storetest.Eventually(t, wait, "five access lines in the log file", func() bool {
		lines, raw = accessLines(t, path)
		return len(lines) >= 5
	})
	l := lines[made]
	if l == nil {
		t.Fatalf("no line for %s in %s", made, raw)
	}
	for k, want := range map[string]any{"gateway": "gw-test", "ns": "shop", "svc": "web", "instance": "web-1", "route": 0.0, "method": "GET",
		"host": "plain.example", "path": "/a/b", "status": 200.0, "client_ip": "127.0.0.1", "logger": "edgeplane.access"} {
		if l[k] != want {
			t.Errorf("line field %s = %v, want %v (line %v)", k, l[k], want, l)
		}
	}
	if d, _ := l["duration_s"].(float64); d <= 0 || d > 5 {
		t.Errorf("duration_s = %v", l["duration_s"])
	}
	if n, _ := l["bytes_out"].(float64); n != float64(len("rid= tp=")+32+55) {
		t.Errorf("bytes_out = %v", l["bytes_out"])
	}
	if _, ok := l["query"]; ok {
		t.Errorf("a query logged on a route that did not ask: %v", l)
	}
	if lines["client-id-1"] == nil || lines[replaced] == nil {
		t.Errorf("no lines for the passed-through or replaced IDs: %s", raw)
	}
	ll := lines[loggedID]
	if ll == nil || ll["query"] != "page=2" || ll["route"] != 1.0 {
		t.Fatalf("the route that asks for the query: %v", ll)
	}
	if h, _ := ll["headers"].(map[string]any); h["X-Tenant"] != "acme" || h["Authorization"] != "Basic bG9nZ2Vk" || h["Cookie"] != nil {
		t.Errorf("the route's headers: %v", ll["headers"])
	}
	if sl := lines[strippedID]; sl == nil || sl["path"] != "/api/g" || sl["route"] != 3.0 {
		t.Errorf("a stripped prefix: the line has the path the client sent, got %v", sl)
	}
	if lines[quietID] != nil {
		t.Errorf("a line for the route with access_log off: %v", lines[quietID])
	}
	for _, secret := range []string{"s3cret-token", "c00kie-value", "qu3ry-secret", "token="} {
		if strings.Contains(raw, secret) {
			t.Errorf("%q in the access log: %s", secret, raw)
		}
	}

	// The same lines, published.
	pub := map[string]store.AccessLine{}
	var rawPub strings.Builder
	deadline := time.Now().Add(wait)
	for len(pub) < 4 && time.Now().Before(deadline) {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		if m.Subject != f.nats.Store.Names.AccessSubject("shop", "web", "gw-test") {
			t.Errorf("published on %s", m.Subject)
		}
		rawPub.Write(m.Data)
		var al store.AccessLine
		if err := json.Unmarshal(m.Data, &al); err != nil {
			t.Fatal(err)
		}
		pub[al.RequestID] = al
	}
	if al, ok := pub[made]; !ok || al.Instance != "web-1" || al.Path != "/a/b" || al.Sample != 1 || al.At.IsZero() || al.Gateway != "gw-test" {
		t.Fatalf("published line of %s: %+v (all: %v)", made, al, pub)
	}
	if _, ok := pub[quietID]; ok {
		t.Errorf("published a line for the route with access_log off")
	}
	for _, secret := range []string{"s3cret-token", "c00kie-value", "qu3ry-secret"} {
		if strings.Contains(rawPub.String(), secret) {
			t.Errorf("%q published: %s", secret, rawPub.String())
		}
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// disable_access_log writes and publishes nothing, and request IDs are
// still set.
func TestAccessLogDisabled(t *testing.T) {
	f := newFixture(t)
	f.app = map[string]any{"disable_access_log": true}
	path := loadWithAccessFile(t, f)
	in := echoIDsBackend(t, "web-1")
	sub, err := f.nats.Store.NC.SubscribeSync(f.nats.Store.Names.AccessWildcard("shop", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"web": {Instances: []storetest.Instance{in},
		Routes: []store.Route{{Hosts: []string{"plain.example"}}}}}))
	r := f.mustGet("plain.example", "/")
	if !strings.HasPrefix(r.body, "rid=") || len(r.body) < 4+32 {
		t.Fatalf("the instance saw %q", r.body)
	}
	if _, err := sub.NextMsg(500 * time.Millisecond); err != nats.ErrTimeout {
		t.Fatalf("published with access logs off: %v", err)
	}
	if lines, raw := accessLines(t, path); len(lines) > 0 {
		t.Fatalf("logged with access logs off: %s", raw)
	}
}

// The sampler publishes at most rate lines a second however many
// requests come, concurrently too; past the rate the lines are spread
// over the second and say their share.
func TestAccessSamplerBound(t *testing.T) {
	var s accessSampler
	base := time.Unix(1_000_000, 0)
	count := func(sec int, n int) (sent int, share float64) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n/8; i++ {
					at := base.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Second/time.Duration(n/8))
					sh, ok := s.admit(at, 100)
					mu.Lock()
					if ok {
						sent++
					}
					share = sh
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return sent, share
	}
	if sent, share := count(0, 80); sent != 80 || share != 1 {
		t.Fatalf("under the rate: %d sent, share %v; want every line, share 1", sent, share)
	}
	if sent, _ := count(1, 4000); sent > 100 {
		t.Fatalf("a burst: %d sent, want at most 100", sent)
	}
	// The second after a busy one: lines drawn at its share, spread.
	sent, share := count(2, 4000)
	if sent > 100 || sent < 60 || share != 100.0/4000 {
		t.Fatalf("steady load: %d sent with share %v; want 60..100 at 0.025", sent, share)
	}
	// After a quiet second, every line again.
	if sent, share := count(4, 40); sent != 40 || share != 1 {
		t.Fatalf("after a quiet second: %d sent, share %v", sent, share)
	}
}

func TestTraceparentAndRequestIDRules(t *testing.T) {
	for tp, want := range map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      true,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more": true,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more": false,
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      false,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01":      false,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":         false,
		"": false,
	} {
		if got := validTraceparent(tp); got != want {
			t.Errorf("validTraceparent(%q) = %v, want %v", tp, got, want)
		}
	}
	for i := 0; i < 100; i++ {
		if tp := newTraceparent(); !validTraceparent(tp) {
			t.Fatalf("made traceparent %q is not valid", tp)
		}
	}
	for id, want := range map[string]bool{"abc-123": true, "req_1.2:3+4/5=6@x": true, "": false, "a b": false,
		"a\"b": false, strings.Repeat("a", 129): false, strings.Repeat("a", 128): true} {
		if got := saneRequestID(id); got != want {
			t.Errorf("saneRequestID(%q) = %v, want %v", id, got, want)
		}
	}
}

// BenchmarkAccessLog compares, through one gateway to the same backends,
// a route writing access lines (to a file through Caddy's logging, as an
// operator would route "edgeplane.access", and published at the default
// rate) against a route with access_log off, in alternating rounds of
// identical load, and reports the req/s ratio (goal >= 0.97) and the
// CPU-per-request ratio. Both set request IDs. Run with -benchtime=1x.
func BenchmarkAccessLog(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	loadWithAccessFile(b, f)
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/off"}, AccessLog: &store.AccessLogPolicy{Off: true}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/on"}},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	off, on := "http://"+f.gateway+"/off", "http://"+f.gateway+"/on?x=1"
	loadRun(b, client, off, "bench.test", workers, 300*time.Millisecond)
	loadRun(b, client, on, "bench.test", workers, 300*time.Millisecond)
	b.ResetTimer()
	var ratios, cpuRatios []float64
	var offRPS, onRPS float64
	for i := 0; i < rounds; i++ {
		var or, nr float64
		var oc, nc time.Duration
		alternate(i, func() { or, _, _, oc = loadRun(b, client, off, "bench.test", workers, round) },
			func() { nr, _, _, nc = loadRun(b, client, on, "bench.test", workers, round) })
		offRPS, onRPS = offRPS+or, onRPS+nr
		ratios = append(ratios, nr/or)
		cpuRatios = append(cpuRatios, float64(nc)/float64(oc))
	}
	sort.Float64s(ratios)
	sort.Float64s(cpuRatios)
	median := func(v []float64) float64 { return (v[(len(v)-1)/2] + v[len(v)/2]) / 2 }
	b.ReportMetric(offRPS/rounds, "off-req/s")
	b.ReportMetric(onRPS/rounds, "on-req/s")
	b.ReportMetric(median(ratios), "rps-ratio(on/off)")
	// CPU per request (the whole process: client, gateway, backends)
	// moves far less with the box's other load than req/s does.
	b.ReportMetric(median(cpuRatios), "cpu-per-req-ratio(on/off)")
}

// BenchmarkAccessLineWrite is the cost one request's access line adds:
// request IDs made, the line built and JSON-encoded by zap (to a
// discarding writer), the sampler asked; nothing published (rate 0).
func BenchmarkAccessLineWrite(b *testing.B) {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.InfoLevel)
	l := &accessLog{logger: zap.New(core).Named("edgeplane.access"), gateway: "gw-1", conn: func() *store.Store { return nil }}
	svc := &projection.Service{Namespace: "shop", Name: "web", Endpoints: []store.Endpoint{{InstanceID: "web-1", Address: "10.0.0.1", Port: 8080}}}
	c := &serviceCounters{namespace: "shop", service: "web"}
	r := httptest.NewRequest("GET", "http://shop.example/a/b?x=1", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		delete(r.Header, headerRequestID)
		delete(r.Header, headerTraceparent)
		id := setRequestIDs(w, r)
		q := accessRequest{log: l, svc: svc, id: id}
		q.write(c, r, 200, 0, 512, time.Millisecond)
	}
}
