package dnsproj

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// upstreamServer is a real miekg/dns resolver on loopback that answers a
// few fixed names and counts the queries it gets.
type upstreamServer struct {
	addr  string
	mu    sync.Mutex
	count map[string]int
	srvs  []*dns.Server
}

func (u *upstreamServer) queries(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[name]
}

func (u *upstreamServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	u.mu.Lock()
	u.count[q.Name]++
	u.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	switch q.Name {
	case "example.com.":
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
	case "big.example.":
		for i := 0; i < 100; i++ {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, byte(i))})
		}
	case ".":
		m.Answer = append(m.Answer, &dns.NS{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: 60}, Ns: "a.root."})
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, &dns.SOA{Hdr: dns.RR_Header{Name: "example.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 30},
			Ns: "ns.example.", Mbox: "h.example.", Serial: 1, Refresh: 1, Retry: 1, Expire: 1, Minttl: 30})
	}
	// Like a real resolver: truncate UDP replies to the client's buffer.
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = int(opt.UDPSize())
	}
	if _, ok := w.LocalAddr().(*net.UDPAddr); ok {
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

// startUpstream serves on addr ("127.0.0.1:0" for a fresh port).
func startUpstream(t testing.TB, addr string) *upstreamServer {
	t.Helper()
	pc, ln, err := listenPair(addr)
	if err != nil {
		t.Fatalf("upstream: %v", err)
	}
	u := &upstreamServer{addr: pc.LocalAddr().String(), count: map[string]int{}}
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: ln, Handler: u}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func() { _ = s.ActivateAndServe() }()
		<-started
		u.srvs = append(u.srvs, s)
	}
	t.Cleanup(u.stop)
	return u
}

func (u *upstreamServer) stop() {
	for _, s := range u.srvs {
		_ = s.Shutdown()
	}
	u.srvs = nil
}

// deadAddr is a loopback UDP/TCP address nobody listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	pc, ln, err := listenPair("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	ln.Close()
	return addr
}

func TestForwardAndCache(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0")
	src := &memSource{}
	src.set(fixtureView(), 1)
	reg := prometheus.NewRegistry()
	s, err := New(Config{Forward: ForwardConfig{Upstreams: []string{up.addr}}, Registerer: reg}, src)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	s.cache.now = func() time.Time { return *clock.Load() }
	addr := serve(t, s)

	r := ask(t, "udp", addr, query("example.com.", dns.TypeA))
	if got := rrStrings(r.Answer); !slices.Equal(got, []string{"example.com. 60 IN A 192.0.2.1"}) || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("forwarded answer %s %q", dns.RcodeToString[r.Rcode], got)
	}
	if r.Authoritative || !r.RecursionAvailable {
		t.Fatalf("AA=%v RA=%v", r.Authoritative, r.RecursionAvailable)
	}

	// Ten seconds later the cache answers, TTL aged, any case.
	later := now.Add(10 * time.Second)
	clock.Store(&later)
	r = ask(t, "tcp", addr, query("EXAMPLE.com.", dns.TypeA))
	if got := rrStrings(r.Answer); !slices.Equal(got, []string{"example.com. 50 IN A 192.0.2.1"}) {
		t.Fatalf("cached answer %q", got)
	}
	if r.Question[0].Name != "EXAMPLE.com." {
		t.Fatalf("question %q", r.Question[0].Name)
	}
	if n := up.queries("example.com."); n != 1 {
		t.Fatalf("upstream asked %d times", n)
	}
	if hits := counterValue(t, reg, "edgeplane_dns_cache_hits_total", nil); hits != 1 {
		t.Fatalf("cache hits %v", hits)
	}

	// Past its TTL the answer is fetched again.
	expired := now.Add(61 * time.Second)
	clock.Store(&expired)
	ask(t, "udp", addr, query("example.com.", dns.TypeA))
	if n := up.queries("example.com."); n != 2 {
		t.Fatalf("upstream asked %d times after expiry", n)
	}

	// NXDOMAIN is forwarded and cached by its SOA.
	for i := 0; i < 2; i++ {
		r = ask(t, "udp", addr, query("nx.example.", dns.TypeA))
		if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 {
			t.Fatalf("negative answer %s", r)
		}
	}
	if n := up.queries("nx.example."); n != 1 {
		t.Fatalf("negative answer fetched %d times", n)
	}

	// A large answer: the upstream truncates over UDP, the forwarder
	// retries over TCP, our UDP client gets TC and retries over TCP too.
	r = ask(t, "udp", addr, query("big.example.", dns.TypeA))
	if !r.Truncated {
		t.Fatalf("UDP reply of 100 records not truncated (%d answers)", len(r.Answer))
	}
	r = ask(t, "tcp", addr, query("big.example.", dns.TypeA))
	if r.Truncated || len(r.Answer) != 100 {
		t.Fatalf("TCP: TC=%v, %d answers", r.Truncated, len(r.Answer))
	}

	// Zone names never reach the upstream or the cache.
	ask(t, "udp", addr, query("web.shop.edgeplane.internal.", dns.TypeA))
	ask(t, "udp", addr, query("nope.edgeplane.internal.", dns.TypeA))
	if n := up.queries("web.shop.edgeplane.internal.") + up.queries("nope.edgeplane.internal."); n != 0 {
		t.Fatalf("zone names forwarded %d times", n)
	}
	if got := counterValue(t, reg, "edgeplane_dns_forward_requests_total", map[string]string{"to": up.addr}); got != 4 {
		t.Fatalf("forward requests %v, want 4", got)
	}
}

func TestForwardFailover(t *testing.T) {
	dead := deadAddr(t)
	live := startUpstream(t, "127.0.0.1:0")
	src := &memSource{}
	src.set(&memView{}, 1)
	reg := prometheus.NewRegistry()
	_, addr := startServer(t, Config{
		Forward: ForwardConfig{Upstreams: []string{dead, live.addr}, MaxFails: 1, HealthCheck: 20 * time.Millisecond},
		Cache:   CacheConfig{Disabled: true}, Registerer: reg,
	}, src)

	r := ask(t, "udp", addr, query("example.com.", dns.TypeA))
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("failover answer: %s", r)
	}
	if errs := counterValue(t, reg, "edgeplane_dns_forward_errors_total", map[string]string{"to": dead}); errs < 1 {
		t.Fatalf("forward errors to the dead upstream: %v", errs)
	}
	eventually(t, 5*time.Second, "dead upstream marked down", func() bool {
		return counterValue(t, reg, "edgeplane_dns_forward_upstream_healthy", map[string]string{"to": dead}) == 0
	})
	// Now marked down, it is skipped: no more attempts at it.
	before := counterValue(t, reg, "edgeplane_dns_forward_requests_total", map[string]string{"to": dead})
	for i := 0; i < 5; i++ {
		if r := ask(t, "udp", addr, query("example.com.", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("answer %s", dns.RcodeToString[r.Rcode])
		}
	}
	if after := counterValue(t, reg, "edgeplane_dns_forward_requests_total", map[string]string{"to": dead}); after != before {
		t.Fatalf("down upstream still tried: %v -> %v", before, after)
	}

	// It comes back: the health check marks it up and it is first again.
	revived := startUpstream(t, dead)
	eventually(t, 5*time.Second, "revived upstream marked up", func() bool {
		return counterValue(t, reg, "edgeplane_dns_forward_upstream_healthy", map[string]string{"to": dead}) == 1
	})
	ask(t, "udp", addr, query("example.com.", dns.TypeA))
	if n := revived.queries("example.com."); n != 1 {
		t.Fatalf("revived first upstream got %d queries", n)
	}

	// The first one dies mid-service: the next query still gets an answer.
	revived.stop()
	if r := ask(t, "tcp", addr, query("example.com.", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after the first upstream died: %s", dns.RcodeToString[r.Rcode])
	}
	// Both gone: SERVFAIL, promptly.
	live.stop()
	if r := ask(t, "udp", addr, query("example.com.", dns.TypeA)); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("no upstream: %s", dns.RcodeToString[r.Rcode])
	}
}

func TestForwardRandomPolicy(t *testing.T) {
	a := startUpstream(t, "127.0.0.1:0")
	b := startUpstream(t, "127.0.0.1:0")
	src := &memSource{}
	src.set(&memView{}, 1)
	_, addr := startServer(t, Config{
		Forward: ForwardConfig{Upstreams: []string{a.addr, b.addr}, Policy: PolicyRandom},
		Cache:   CacheConfig{Disabled: true},
	}, src)
	for i := 0; i < 200 && (a.queries("example.com.") == 0 || b.queries("example.com.") == 0); i++ {
		ask(t, "udp", addr, query("example.com.", dns.TypeA))
	}
	if a.queries("example.com.") == 0 || b.queries("example.com.") == 0 {
		t.Fatalf("random policy used one upstream only: %d/%d", a.queries("example.com."), b.queries("example.com."))
	}
}

func TestUpstreamAddr(t *testing.T) {
	for in, want := range map[string]string{
		"1.1.1.1": "1.1.1.1:53", "1.1.1.1:5353": "1.1.1.1:5353", "dns://9.9.9.9": "9.9.9.9:53",
		"::1": "[::1]:53", "[::1]:54": "[::1]:54",
	} {
		got, err := UpstreamAddr(in)
		if err != nil || got != want {
			t.Errorf("UpstreamAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "resolver.example", "1.1.1.1:0", "1.1.1.1:x"} {
		if _, err := UpstreamAddr(bad); err == nil {
			t.Errorf("UpstreamAddr(%q) accepted", bad)
		}
	}
}

// TestCacheEviction keeps the cache at its size.
func TestCacheEviction(t *testing.T) {
	m, _ := newMetrics(nil)
	c, err := newCache(CacheConfig{Size: 3}, m)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		r := new(dns.Msg)
		name := fmt.Sprintf("n%d.example.", i)
		r.SetQuestion(name, dns.TypeA)
		r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}}
		c.store(cacheKey{name: name, qtype: dns.TypeA, class: dns.ClassINET}, r)
	}
	if n := len(c.items); n != 3 {
		t.Fatalf("%d entries, want 3", n)
	}
}
