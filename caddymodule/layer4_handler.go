package caddymodule

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(L4Handler{})
}

// DefaultL4DialTimeout bounds one dial to an instance before the next
// candidate is tried.
const DefaultL4DialTimeout = 3 * time.Second

// l4ServerNameKey is the replacer key caddy-l4's tls matcher sets to the
// ClientHello's server name.
const l4ServerNameKey = "l4.tls.server_name"

// L4Handler is `layer4.handlers.edgeplane`: it proxies a layer-4
// connection to an instance of the service the routing projection gives
// for it, unterminated, with the same protocol. The gateway's own ports
// (opened as routing asks, see the app's layer4_bind) use it with Port
// set; on the HTTPS listener, behind caddy-l4's tls matcher and
// `tls.handshake_match.edgeplane_passthrough`, it routes by the
// ClientHello's server name (TLS passthrough).
//
// The instance is chosen as for an HTTP request (the serving tier, down
// machines and failing probes set aside, fail open, slow start), the
// canary side by connection with the split's weight, then the candidate
// with the fewest open connections; a failed dial tries the next. A
// connection no instance takes is closed.
type L4Handler struct {
	// Port is the gateway port ("tcp/5432", "udp/5353") whose service the
	// connection reaches. Empty: the service whose tls_passthrough hosts
	// name the connection's TLS server name.
	Port string `json:"port,omitempty"`
	// Namespace and Service pin one service, whatever the port or server
	// name; both or neither.
	Namespace string `json:"namespace,omitempty"`
	Service   string `json:"service,omitempty"`
	// DialTimeout bounds one dial to an instance. Default: 3s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	shared *sharedProjection
	port   store.PortKey
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (L4Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.edgeplane",
		New: func() caddy.Module { return new(L4Handler) },
	}
}

// sharedKey carries the shared projection into the contexts the port
// manager provisions its servers in, which have no config to find the
// edgeplane app in.
type sharedKey struct{}

// Provision attaches to the shared projection.
func (h *L4Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.Port != "" {
		k, err := store.ParsePortKey(h.Port)
		if err != nil {
			return fmt.Errorf("provisioning edgeplane layer-4 handler: %w", err)
		}
		h.port = k
	}
	if s, ok := ctx.Value(sharedKey{}).(*sharedProjection); ok {
		h.shared = s
	} else {
		app, err := edgeplaneApp(ctx)
		if err != nil {
			return fmt.Errorf("provisioning edgeplane layer-4 handler: %w", err)
		}
		h.shared = app.shared
	}
	return nil
}

// Validate checks that namespace and service come together.
func (h *L4Handler) Validate() error {
	if (h.Namespace == "") != (h.Service == "") {
		return fmt.Errorf("edgeplane layer-4 handler: namespace and service must be set together (got namespace %q, service %q)", h.Namespace, h.Service)
	}
	if h.DialTimeout < 0 {
		return fmt.Errorf("edgeplane layer-4 handler: dial_timeout must not be negative")
	}
	return nil
}

// serviceOf is the service cx reaches under v.
func (h *L4Handler) serviceOf(v *projection.View, cx *layer4.Connection) (*projection.Service, bool) {
	switch {
	case h.Service != "":
		return v.Service(h.Namespace, h.Service)
	case h.Port != "":
		return v.Layer4().Port(h.port)
	}
	sni, _ := cx.Replacer().GetString(l4ServerNameKey)
	return v.Layer4().Passthrough(sni)
}

// Handle proxies cx to an instance; it is terminal (next is not called).
func (h *L4Handler) Handle(cx *layer4.Connection, _ layer4.Handler) error {
	s := h.shared
	app := s.app.Load()
	if app == nil {
		return nil // between configs: nothing serves
	}
	v := s.proj.View()
	svc, ok := h.serviceOf(v, cx)
	if !ok {
		if c := h.logger.Check(zapcore.DebugLevel, "no layer-4 route"); c != nil {
			c.Write(zap.String("port", h.Port), zap.String("remote", cx.RemoteAddr().String()))
		}
		return nil
	}
	counters := &s.traffic.of(svc).l4
	side := unsplit
	if svc.Split != nil {
		side = connSide(svc)
	}
	proto := store.ProtoTCP
	if h.port.Proto == store.ProtoUDP {
		proto = store.ProtoUDP
	}
	up, dial, err := s.l4.dial(proto, app.candidates(v, svc, side), time.Duration(cmp.Or(h.DialTimeout, caddy.Duration(DefaultL4DialTimeout))), counters)
	if err != nil {
		counters.refused.Add(1)
		if c := h.logger.Check(zapcore.DebugLevel, "no instance took a layer-4 connection"); c != nil {
			c.Write(zap.String("service", svc.Key()), zap.Error(err))
		}
		return nil
	}
	defer up.Close()
	var closed atomic.Bool
	conn := s.l4.register(svc, instanceOf(svc, dial), dial, func() {
		closed.Store(true)
		_ = cx.Conn.Close()
		_ = up.Close()
	})
	defer s.l4.unregister(conn)
	counters.total.Add(1)
	counters.open.Add(1)
	defer counters.open.Add(-1)
	pipe(cx, up, proto == store.ProtoUDP, counters, conn)
	if closed.Load() {
		if c := h.logger.Check(zapcore.DebugLevel, "layer-4 connection closed at the end of its drain"); c != nil {
			c.Write(zap.String("service", svc.Key()), zap.String("upstream", dial))
		}
	}
	return nil
}

// connSide is the canary side a new connection to split svc goes to:
// exactly the split's weight of every 100 connections to the new side.
func connSide(svc *projection.Service) int {
	old, fresh := svc.Sides()
	switch {
	case len(fresh) == 0:
		return sideOld
	case len(old) == 0:
		return sideNew
	}
	return countedSide(svc, min(max(svc.Split.Weight, 0), 100))
}

// instanceOf is the instance of svc at dial.
func instanceOf(svc *projection.Service, dial string) string {
	for i, d := range dialsOf(svc) {
		if d == dial {
			return svc.Endpoints[i].InstanceID
		}
	}
	return ""
}

// errNoInstance: no candidate, or every dial failed.
var errNoInstance = errors.New("no instance took the connection")

// dial connects to the least loaded of dials, trying the next on a
// failure (each counted in ConnectErrors).
func (r *l4Registry) dial(proto string, dials []string, timeout time.Duration, c *l4Counters) (net.Conn, string, error) {
	var tried []string
	var last error
	for range dials {
		d := r.pick(dials, tried)
		if d == "" {
			break
		}
		up, err := net.DialTimeout(proto, d, timeout)
		if err == nil {
			return up, d, nil
		}
		r.release(d)
		c.connectErrors.Add(1)
		tried, last = append(tried, d), err
	}
	if last != nil {
		return nil, "", fmt.Errorf("%w: %w", errNoInstance, last)
	}
	return nil, "", errNoInstance
}

type closeWriter interface{ CloseWrite() error }

// pipe copies down to up and up to down until both ends are done,
// counting bytes. TCP half-closes (CloseWrite) each side when the other
// finished sending, as caddy-l4's proxy does; for UDP (one datagram per
// read, one per write) the client side's end, at the server's idle
// timeout, closes the upstream socket. A TCP client connection is copied
// from its socket itself once the bytes caddy-l4 read while matching
// (a passthrough's ClientHello) are sent, by the kernel (splicedPipe)
// when the instance's is a TCP socket too; conn holds it for counting.
func pipe(down *layer4.Connection, up net.Conn, udp bool, c *l4Counters, conn *l4Conn) {
	var src io.Reader = down // client to instance
	var dst io.Writer = down // instance to client
	if tc, ok := down.Conn.(*net.TCPConn); ok && !udp {
		var base uint64
		if b := down.MatchingBytes(); len(b) > 0 {
			n, err := up.Write(b)
			c.bytesIn.Add(uint64(n))
			if err != nil {
				return
			}
			base = uint64(n)
		}
		if sp := newSplicedPipe(tc, up, &c.bytesIn, &c.bytesOut, base); sp != nil {
			conn.spliced.Store(sp)
			sp.run()
			return
		}
		src, dst = tc, tc
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = copyCounted(dst, up, &c.bytesOut)
		if cw, ok := down.Conn.(closeWriter); ok {
			_ = cw.CloseWrite()
		}
	}()
	_ = copyCounted(up, src, &c.bytesIn)
	if cw, ok := up.(closeWriter); ok && !udp {
		_ = cw.CloseWrite()
	} else {
		_ = up.Close()
	}
	<-done
}

// copyBufSize is one read's size: it fits the largest UDP datagram
// caddy-l4 reads (9000), and TCP moves in reads this large.
const copyBufSize = 64 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyCounted copies src to dst write by write (one datagram per write
// for UDP) until src ends, adding each write to n: a long connection's
// bytes are counted as they flow. (Splicing TCP in the kernel would count
// them only per chunk, and measured no faster on loopback.)
func copyCounted(dst io.Writer, src io.Reader, n *atomic.Uint64) error {
	// Buffers are pooled: a client that opens a connection per command
	// (redis-benchmark -k 0, a DNS client over UDP) would otherwise
	// allocate 128 KiB per connection.
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if werr != nil {
				return werr
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return nil
			}
			return rerr
		}
	}
}

// Interface guards
var (
	_ caddy.Provisioner  = (*L4Handler)(nil)
	_ caddy.Validator    = (*L4Handler)(nil)
	_ layer4.NextHandler = (*L4Handler)(nil)
)
