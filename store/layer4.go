package store

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Layer 4. A service may be reached through a gateway by more than HTTP:
// a gateway port forwarded to its instances over TCP or UDP, and TLS
// connections on the gateway's HTTPS port routed by their SNI to the
// instances without being terminated (passthrough). What a manifest asks
// is in its ServiceSpec and travels in the service's routing upserts; the
// gateway opens and closes its ports as routing changes. A gateway port
// belongs to one namespace, as a host does: the claim is a PortClaim,
// taken at apply under HostsLockKey beside the host claims.

// Layer-4 protocols, as a manifest and a port's key name them.
const (
	ProtoTCP = "tcp"
	ProtoUDP = "udp"
)

// CodePortOwned refuses a manifest that exposes a gateway port another
// namespace owns.
const CodePortOwned = "port_owned"

// DefaultDrainTimeout is how long a gateway lets a layer-4 connection to
// an instance that left routing flow before it ends it, for a service that
// sets no drain_timeout.
const DefaultDrainTimeout = 30 * time.Second

// MaxDrainTimeout bounds a service's drain timeout: a deploy waits for it.
const MaxDrainTimeout = time.Hour

// L4Port is one gateway port forwarded to a service's instances, which
// take it on their own port (the PORT they listen on) with the same
// protocol.
type L4Port struct {
	Port int `json:"port" yaml:"port"`
}

// Passthrough routes TLS connections on a gateway's HTTPS port by the
// server name of their ClientHello to the service's instances, which
// terminate TLS themselves.
type Passthrough struct {
	Hosts []string `json:"hosts" yaml:"hosts"`
}

// Layer4 is what a service exposes below HTTP, as its spec and its routing
// upserts carry it.
type Layer4 struct {
	TCP            []L4Port     `json:"tcp,omitempty" yaml:"tcp,omitempty"`
	UDP            []L4Port     `json:"udp,omitempty" yaml:"udp,omitempty"`
	TLSPassthrough *Passthrough `json:"tls_passthrough,omitempty" yaml:"tls_passthrough,omitempty"`
	// DrainTimeout is how long a layer-4 connection to an instance that
	// left routing may go on before the gateway ends it; zero is
	// DefaultDrainTimeout.
	DrainTimeout Duration `json:"drain_timeout,omitempty" yaml:"drain_timeout,omitempty"`
}

// Empty says the service exposes nothing below HTTP.
func (l *Layer4) Empty() bool {
	return l == nil || (len(l.TCP) == 0 && len(l.UDP) == 0 && (l.TLSPassthrough == nil || len(l.TLSPassthrough.Hosts) == 0))
}

// Drain is DrainTimeout with its default applied.
func (l *Layer4) Drain() time.Duration {
	if l == nil || l.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return time.Duration(l.DrainTimeout)
}

// PassthroughHosts is the passthrough hosts, nil without any.
func (l *Layer4) PassthroughHosts() []string {
	if l == nil || l.TLSPassthrough == nil {
		return nil
	}
	return l.TLSPassthrough.Hosts
}

// Ports lists the (protocol, port) pairs the service exposes, TCP first.
func (l *Layer4) Ports() []PortKey {
	if l == nil {
		return nil
	}
	out := make([]PortKey, 0, len(l.TCP)+len(l.UDP))
	for _, p := range l.TCP {
		out = append(out, PortKey{Proto: ProtoTCP, Port: p.Port})
	}
	for _, p := range l.UDP {
		out = append(out, PortKey{Proto: ProtoUDP, Port: p.Port})
	}
	return out
}

// PortKey is a gateway port with its protocol.
type PortKey struct {
	Proto string `json:"proto"`
	Port  int    `json:"port"`
}

// String is "tcp/5432", as Caddy's network addresses name a port.
func (k PortKey) String() string { return k.Proto + "/" + strconv.Itoa(k.Port) }

// Compare orders ports by protocol, then number.
func (k PortKey) Compare(o PortKey) int {
	if c := strings.Compare(k.Proto, o.Proto); c != 0 {
		return c
	}
	return k.Port - o.Port
}

// ParsePortKey parses "tcp/5432".
func ParsePortKey(s string) (PortKey, error) {
	proto, num, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || (proto != ProtoTCP && proto != ProtoUDP) || n < 1 || n > 65535 {
		return PortKey{}, fmt.Errorf("port %q: want tcp/N or udp/N with N in 1-65535", s)
	}
	return PortKey{Proto: proto, Port: n}, nil
}

// ReservedPorts are the gateway ports no service may expose: the
// gateway's own HTTP and HTTPS (HTTP/3 on UDP 443; TLS on 443 is shared
// through tls_passthrough instead), Caddy's admin API, the NATS client,
// cluster, leaf and monitoring ports, the mesh's WireGuard port and the
// STUN port of a control server. A gateway also refuses, at bind, any
// port another part of its own process holds, and reports it.
var ReservedPorts = []PortKey{
	{ProtoTCP, 80}, {ProtoTCP, 443}, {ProtoUDP, 443}, {ProtoTCP, 2019},
	{ProtoTCP, 4222}, {ProtoTCP, 6222}, {ProtoTCP, 7422}, {ProtoTCP, 8222},
	{ProtoUDP, 3478}, {ProtoUDP, 51820},
}

// Reserved says whether k is one of ReservedPorts.
func (k PortKey) Reserved() bool { return slices.Contains(ReservedPorts, k) }

// PortClaim says which namespace owns a gateway port. Key: PortClaimKey.
type PortClaim struct {
	Version   int       `json:"version"`
	Proto     string    `json:"proto"`
	Port      int       `json:"port"`
	Namespace string    `json:"namespace"`
	Service   string    `json:"service"`
	At        time.Time `json:"at"`
}

func (r *PortClaim) version() int { return r.Version }

// Key is the port the claim is for.
func (r *PortClaim) Key() PortKey { return PortKey{Proto: r.Proto, Port: r.Port} }

// KeyOK checks that the claim is filed under its port.
func (r *PortClaim) KeyOK(key string) error { return keyMust(key, PortClaimKey(r.Key())) }

// portClaimPrefix starts every port claim's key in the hosts bucket. A
// host key is a host's labels reversed, and no host label has a '=', so
// port claims and host claims never share a key.
const portClaimPrefix = "=port."

// PortClaimKey is a port's key in the hosts bucket: "=port.tcp.5432".
func PortClaimKey(k PortKey) string { return portClaimPrefix + k.Proto + "." + strconv.Itoa(k.Port) }

// L4Traffic is a service's layer-4 connections through one gateway, as
// its traffic report carries them (ServiceTraffic.L4): cumulative since
// the gateway's counters started, except Open.
type L4Traffic struct {
	// Open is the connections in progress now (a gauge); Total every
	// connection proxied to an instance.
	Open  int64  `json:"open"`
	Total uint64 `json:"total"`
	// BytesIn are bytes from clients to instances, BytesOut the other way.
	BytesIn  uint64 `json:"in,omitempty"`
	BytesOut uint64 `json:"out,omitempty"`
	// ConnectErrors counts dials to an instance that failed (a client
	// whose connection another instance then took included).
	ConnectErrors uint64 `json:"connect_errors,omitempty"`
	// Refused counts client connections no instance took.
	Refused uint64 `json:"refused,omitempty"`
}

// L4Drain is a gateway's layer-4 connections to an instance that left
// routing, which it lets flow until they close or Until passes (the
// service's drain timeout), in its observation (GatewayObservation). A
// deploy stops the instance once no gateway reports any.
type L4Drain struct {
	Namespace string    `json:"ns"`
	Service   string    `json:"svc"`
	Instance  string    `json:"instance"`
	Conns     int       `json:"conns"`
	Until     time.Time `json:"until"`
}

// L4PortError is a gateway port the routing asks for that the gateway
// could not open, and why ("listen tcp :5432: bind: address already in
// use"). The gateway retries it; everything else it serves is unaffected.
type L4PortError struct {
	Port      string    `json:"port"`
	Namespace string    `json:"ns"`
	Service   string    `json:"svc"`
	Error     string    `json:"error"`
	Since     time.Time `json:"since"`
}

// MaxL4Reported bounds the drains and port errors one observation names.
const MaxL4Reported = 1000
