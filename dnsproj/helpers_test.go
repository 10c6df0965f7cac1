package dnsproj

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// memView is a tiny in-memory View for pure table tests of the zone; the
// projection-fed tests use real *projection.View values.
type memView struct {
	services []*projection.Service
	machines []store.MachineRecord
}

func (v *memView) Services() []*projection.Service { return v.services }
func (v *memView) Machines() []store.MachineRecord { return v.machines }
func (v *memView) LiveEndpoints(svc *projection.Service) ([]store.Endpoint, bool) {
	return svc.Endpoints, false
}

// A memView has no regions: every service is local to any reader.
func (v *memView) Local(*projection.Service, string) bool { return true }
func (v *memView) Tiers(svc *projection.Service, _ string, _ []string) []projection.Tier {
	all := make([]int, len(svc.Endpoints))
	for i := range all {
		all[i] = i
	}
	return []projection.Tier{{State: store.RegionActive, Endpoints: all}}
}
func (v *memView) Down(string) (projection.MachineDown, bool) { return projection.MachineDown{}, false }

// memSource hands out a memView that a test swaps.
type memSource struct {
	mu    sync.Mutex
	v     *memView
	seq   uint64
	stale bool
}

func (s *memSource) Current() (View, uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v, s.seq, s.stale
}

func (s *memSource) set(v *memView, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.v, s.seq = v, seq
}

func svc(ns, name string, eps ...store.Endpoint) *projection.Service {
	return &projection.Service{Namespace: ns, Name: name, DeployID: ns + "-d1", Revision: 1, Endpoints: eps}
}

func ep(id string, slot int, addr string, port int) store.Endpoint {
	return store.Endpoint{InstanceID: id, Machine: "m1", Slot: slot, Revision: 1, Address: addr, Port: port}
}

// startServer serves cfg over src on UDP and TCP at 127.0.0.1:<free port>.
func startServer(t testing.TB, cfg Config, src Source) (*Server, string) {
	t.Helper()
	s, err := New(cfg, src)
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	return s, serve(t, s)
}

// serve serves s on UDP and TCP at 127.0.0.1:<free port> until the test ends.
func serve(t testing.TB, s *Server) string {
	t.Helper()
	addr, err := s.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return addr
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// ask sends m over proto ("udp" or "tcp") and returns the reply.
func ask(t testing.TB, proto, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: proto, Timeout: 3 * time.Second, UDPSize: dns.MaxMsgSize}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", proto, m.Question[0].String(), err)
	}
	return r
}

// rrStrings renders rrs sorted, for order-free comparison.
func rrStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeOPT {
			continue
		}
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	sort.Strings(out)
	return out
}

// counterValue reads a counter or gauge from reg by name and labels.
func counterValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			return metricValue(m)
		}
	}
	return 0
}

func metricValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return 0
}

// eventually polls cond every 5ms until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
