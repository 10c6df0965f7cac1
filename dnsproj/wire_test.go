package dnsproj

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// rawUDP sends payload and returns the reply's bytes, or nil when none
// arrives within wait.
func rawUDP(t testing.TB, addr string, payload []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, dns.MaxMsgSize)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	n, err := c.Read(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// rawTCP sends one length-prefixed payload and returns the reply, or nil
// when the server closes the connection instead.
func rawTCP(t testing.TB, addr string, payload []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := binary.BigEndian.AppendUint16(nil, uint16(len(payload)))
	if _, err := c.Write(append(msg, payload...)); err != nil {
		return nil // the server may close before reading it all
	}
	var l uint16
	if err := binary.Read(c, binary.BigEndian, &l); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return nil
		}
		t.Fatalf("reading reply: %v", err)
	}
	out := make([]byte, l)
	if _, err := io.ReadFull(c, out); err != nil {
		t.Fatalf("reading reply: %v", err)
	}
	return out
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

func unpack(t testing.TB, b []byte) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("unpacking reply: %v", err)
	}
	return m
}

func pack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRcodes covers the protocol-level rcodes over both transports, and
// queries that get no reply at all.
func TestRcodes(t *testing.T) {
	src := &memSource{}
	src.set(&memView{}, 1)
	_, addr := startServer(t, Config{}, src)

	noQuestion := new(dns.Msg)
	noQuestion.Id = 1
	twoQuestions := query("a.edgeplane.internal.", dns.TypeA)
	twoQuestions.Question = append(twoQuestions.Question, twoQuestions.Question[0])
	update := new(dns.Msg)
	update.SetUpdate("edgeplane.internal.")
	notify := new(dns.Msg)
	notify.SetNotify("edgeplane.internal.")
	badVers := query("edgeplane.internal.", dns.TypeSOA)
	badVers.SetEdns0(1232, false)
	badVers.IsEdns0().SetVersion(1)
	cutQuestion := pack(t, query("edgeplane.internal.", dns.TypeSOA))
	cutQuestion = cutQuestion[:len(cutQuestion)-3]

	cases := []struct {
		name    string
		payload []byte
		rcode   int // -1: no reply expected
	}{
		{"no question: FORMERR", pack(t, noQuestion), dns.RcodeFormatError},
		{"two questions: FORMERR", pack(t, twoQuestions), dns.RcodeFormatError},
		{"cut question: FORMERR", cutQuestion, dns.RcodeFormatError},
		{"UPDATE: NOTIMP", pack(t, update), dns.RcodeNotImplemented},
		{"NOTIFY: NOTIMP", pack(t, notify), dns.RcodeNotImplemented},
		{"EDNS version 1: BADVERS", pack(t, badVers), dns.RcodeBadVers},
	}
	for _, tc := range cases {
		for _, proto := range []string{"udp", "tcp"} {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				var b []byte
				if proto == "udp" {
					b = rawUDP(t, addr, tc.payload, 3*time.Second)
				} else {
					b = rawTCP(t, addr, tc.payload)
				}
				if b == nil {
					t.Fatal("no reply")
				}
				r := unpack(t, b)
				if r.Rcode != tc.rcode || !r.Response {
					t.Fatalf("rcode %s (response=%v), want %s", dns.RcodeToString[r.Rcode], r.Response, dns.RcodeToString[tc.rcode])
				}
				if tc.rcode == dns.RcodeBadVers && r.IsEdns0() == nil {
					t.Fatal("BADVERS without an OPT record")
				}
			})
		}
	}
}

// TestDroppedQueries shows what gets no reply: responses, runts and
// oversized queries. Absence is shown by a short read deadline, then the
// server proves it is still answering.
func TestDroppedQueries(t *testing.T) {
	src := &memSource{}
	src.set(&memView{}, 1)
	_, addr := startServer(t, Config{}, src)

	resp := query("edgeplane.internal.", dns.TypeSOA)
	resp.Response = true
	huge := query("edgeplane.internal.", dns.TypeSOA)
	huge.SetEdns0(1232, false)
	huge.IsEdns0().Option = append(huge.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 2000)})

	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		{"a response", pack(t, resp)},
		{"shorter than a header", []byte{1, 2, 3}},
		{"larger than max query size", pack(t, huge)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if b := rawUDP(t, addr, tc.payload, 200*time.Millisecond); b != nil {
				t.Fatalf("got a reply: %v", unpack(t, b))
			}
			if r := ask(t, "udp", addr, query("edgeplane.internal.", dns.TypeSOA)); r.Rcode != dns.RcodeSuccess {
				t.Fatalf("server unwell afterwards: %s", dns.RcodeToString[r.Rcode])
			}
		})
	}
	t.Run("tcp oversized query closes the connection", func(t *testing.T) {
		if b := rawTCP(t, addr, pack(t, huge)); b != nil {
			t.Fatalf("got a reply: %v", unpack(t, b))
		}
		if r := ask(t, "tcp", addr, query("edgeplane.internal.", dns.TypeSOA)); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("server unwell afterwards: %s", dns.RcodeToString[r.Rcode])
		}
	})
}

// bigView holds a service with n IPv4 endpoints.
func bigView(n int) *memView {
	var eps []store.Endpoint
	for i := 0; i < n; i++ {
		eps = append(eps, ep(fmt.Sprintf("i%d", i), i, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), 8000+i))
	}
	return &memView{services: []*projection.Service{svc("shop", "big", eps...)}}
}

// TestTruncation checks that UDP replies honour the client's EDNS0 buffer
// (capped by MaxUDPSize), set TC when records are cut, and that the TCP
// retry gets everything, compressed.
func TestTruncation(t *testing.T) {
	src := &memSource{}
	src.set(bigView(100), 1)
	_, addr := startServer(t, Config{}, src)
	_, addr4k := startServer(t, Config{MaxUDPSize: 4096}, src)
	const name = "big.shop.edgeplane.internal."

	for _, tc := range []struct {
		name     string
		addr     string
		edns     uint16 // 0: no OPT
		do       bool
		limit    int
		complete bool
	}{
		{"no EDNS: 512 bytes", addr, 0, false, 512, false},
		{"EDNS 1000", addr, 1000, false, 1000, false},
		{"EDNS 4096 capped at 1232", addr, 4096, true, 1232, false},
		{"EDNS 4096 with max udp size 4096", addr4k, 4096, false, 4096, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := query(name, dns.TypeA)
			if tc.edns != 0 {
				q.SetEdns0(tc.edns, tc.do)
			}
			b := rawUDP(t, tc.addr, pack(t, q), 3*time.Second)
			if b == nil {
				t.Fatal("no reply")
			}
			if len(b) > tc.limit {
				t.Fatalf("reply is %d bytes, over %d", len(b), tc.limit)
			}
			r := unpack(t, b)
			if r.Truncated == tc.complete {
				t.Fatalf("TC = %v with %d answers", r.Truncated, len(r.Answer))
			}
			if tc.complete != (len(r.Answer) == 100) {
				t.Fatalf("%d answers", len(r.Answer))
			}
			opt := r.IsEdns0()
			if (opt != nil) != (tc.edns != 0) {
				t.Fatalf("OPT in reply: %v", opt)
			}
			if opt != nil && opt.Do() != tc.do {
				t.Fatalf("DO bit not echoed")
			}
		})
	}

	t.Run("TCP fallback gets every record, compressed", func(t *testing.T) {
		b := rawTCP(t, addr, pack(t, query(name, dns.TypeA)))
		r := unpack(t, b)
		if r.Truncated || len(r.Answer) != 100 {
			t.Fatalf("TC=%v, %d answers", r.Truncated, len(r.Answer))
		}
		r.Compress = false
		if uncompressed := r.Len(); len(b) >= uncompressed {
			t.Fatalf("reply %d bytes, uncompressed %d: not compressed", len(b), uncompressed)
		}
	})
	t.Run("SRV additional records are truncated too", func(t *testing.T) {
		b := rawUDP(t, addr, pack(t, query(name, dns.TypeSRV)), 3*time.Second)
		if r := unpack(t, b); !r.Truncated || len(b) > 512 {
			t.Fatalf("TC=%v, %d bytes", r.Truncated, len(b))
		}
	})
}

// TestMetrics counts queries by transport, type and rcode.
func TestMetrics(t *testing.T) {
	src := &memSource{}
	src.set(fixtureView(), 9)
	reg := prometheus.NewRegistry()
	_, addr := startServer(t, Config{Registerer: reg}, src)
	for i := 0; i < 3; i++ {
		ask(t, "udp", addr, query("web.shop.edgeplane.internal.", dns.TypeA))
	}
	ask(t, "tcp", addr, query("web.shop.edgeplane.internal.", dns.TypeSRV))
	ask(t, "udp", addr, query("nope.edgeplane.internal.", dns.TypeAAAA))
	ask(t, "udp", addr, query("example.com.", 65534))

	for _, tc := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"proto": "udp", "type": "A", "rcode": "NOERROR"}, 3},
		{map[string]string{"proto": "tcp", "type": "SRV", "rcode": "NOERROR"}, 1},
		{map[string]string{"proto": "udp", "type": "AAAA", "rcode": "NXDOMAIN"}, 1},
		{map[string]string{"proto": "udp", "type": "other", "rcode": "REFUSED"}, 1},
	} {
		// A query is counted after its reply is written, so the client
		// may see the reply first.
		eventually(t, 5*time.Second, fmt.Sprintf("queries_total%v = %v", tc.labels, tc.want), func() bool {
			return counterValue(t, reg, "edgeplane_dns_queries_total", tc.labels) == tc.want
		})
	}
	if got := counterValue(t, reg, "edgeplane_dns_zone_routing_seq", nil); got != 9 {
		t.Errorf("zone_routing_seq = %v", got)
	}
	// A second server on the same registry shares the collectors.
	if _, err := New(Config{Registerer: reg}, src); err != nil {
		t.Fatalf("second server on one registry: %v", err)
	}
}
