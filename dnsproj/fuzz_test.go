package dnsproj

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// recorder is a dns.ResponseWriter that keeps what is written, like
// CoreDNS's dnstest.Recorder.
type recorder struct {
	local net.Addr
	out   [][]byte
}

func (r *recorder) LocalAddr() net.Addr  { return r.local }
func (r *recorder) RemoteAddr() net.Addr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 5353} }
func (r *recorder) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	r.out = append(r.out, b)
	return nil
}
func (r *recorder) Write(b []byte) (int, error) {
	r.out = append(r.out, append([]byte(nil), b...))
	return len(b), nil
}
func (r *recorder) Close() error        { return nil }
func (r *recorder) TsigStatus() error   { return nil }
func (r *recorder) TsigTimersOnly(bool) {}
func (r *recorder) Hijack()             {}

// serveBytes runs data through the query path the way the dns.Server
// does: header check, unpack, then our handler; it returns the replies.
func serveBytes(s *Server, data []byte, tcp bool) [][]byte {
	if len(data) < 12 {
		return nil
	}
	dh := dns.Header{
		Id: binary.BigEndian.Uint16(data), Bits: binary.BigEndian.Uint16(data[2:]),
		Qdcount: binary.BigEndian.Uint16(data[4:]), Ancount: binary.BigEndian.Uint16(data[6:]),
		Nscount: binary.BigEndian.Uint16(data[8:]), Arcount: binary.BigEndian.Uint16(data[10:]),
	}
	if acceptQuery(dh) != dns.MsgAccept {
		return nil
	}
	req := new(dns.Msg)
	if err := req.Unpack(data); err != nil {
		return nil
	}
	rec := &recorder{local: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}}
	if tcp {
		rec.local = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
	}
	s.ServeDNS(rec, req)
	return rec.out
}

func fuzzSeeds() [][]byte {
	var out [][]byte
	add := func(m *dns.Msg) {
		b, err := m.Pack()
		if err == nil {
			out = append(out, b)
		}
	}
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"web.shop.edgeplane.internal.", dns.TypeA}, {"web.shop.edgeplane.internal.", dns.TypeSRV},
		{"_http._tcp.web.shop.edgeplane.internal.", dns.TypeSRV}, {"WEB.shop.EDGEPLANE.internal.", dns.TypeAAAA},
		{"edgeplane.internal.", dns.TypeANY}, {"edgeplane.internal.", dns.TypeAXFR}, {"nope.edgeplane.internal.", dns.TypeA},
		{"example.com.", dns.TypeA}, {"nx.example.", dns.TypeMX}, {".", dns.TypeNS},
	} {
		m := query(q.name, q.qtype)
		add(m)
		m.SetEdns0(4096, true)
		add(m)
	}
	m := query("big.shop.edgeplane.internal.", dns.TypeSRV)
	m.SetEdns0(600, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	add(m)
	v1 := query("edgeplane.internal.", dns.TypeSOA)
	v1.SetEdns0(1232, false)
	v1.IsEdns0().SetVersion(3)
	add(v1)
	upd := new(dns.Msg)
	upd.SetUpdate("edgeplane.internal.")
	add(upd)
	out = append(out,
		[]byte{},
		[]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},                                                              // header only, one question promised
		[]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1},                                        // a compression pointer to itself
		[]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 41, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff}, // OPT rdlen past the end
		[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	)
	return out
}

// FuzzQuery feeds arbitrary bytes to the query path, in process (so a
// panic or hang is pinned to the input) and over a real UDP socket, after
// which the server must still answer a probe. With `go test` it runs the
// seed corpus; `go test -fuzz FuzzQuery ./dnsproj/` explores further.
func FuzzQuery(f *testing.F) {
	up := startUpstream(f, "127.0.0.1:0")
	src := &memSource{}
	v := fixtureView()
	v.services = append(v.services, bigView(60).services...)
	src.set(v, 3)
	s, addr := startServer(f, Config{Forward: ForwardConfig{Upstreams: []string{up.addr}}}, src)
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	probe := query("web.shop.edgeplane.internal.", dns.TypeA)
	probe.Id = 4242
	probeBytes, err := probe.Pack()
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tcp := range []bool{false, true} {
			done := make(chan [][]byte, 1)
			go func() { done <- serveBytes(s, data, tcp) }()
			var replies [][]byte
			select {
			case replies = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("query path hung on %x", data)
			}
			if len(replies) > 1 {
				t.Fatalf("%d replies to one query", len(replies))
			}
			for _, b := range replies {
				if !tcp && len(b) > DefaultMaxUDPSize {
					t.Fatalf("UDP reply of %d bytes", len(b))
				}
				r := new(dns.Msg)
				if err := r.Unpack(b); err != nil {
					t.Fatalf("our reply does not parse: %v", err)
				}
				if !r.Response || r.Id != binary.BigEndian.Uint16(data) {
					t.Fatalf("reply is not a response to the query: %v", r)
				}
			}
		}

		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if len(data) > 0 && len(data) <= 65000 {
			if _, err := c.Write(data); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Write(probeBytes); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, dns.MaxMsgSize)
		for {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("server stopped answering after %x: %v", data, err)
			}
			r := new(dns.Msg)
			if r.Unpack(buf[:n]) == nil && r.Id == probe.Id && len(r.Answer) > 0 {
				return
			}
		}
	})
}
