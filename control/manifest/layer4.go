package manifest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Layer-4 rules. A gateway port carries one protocol for one service of
// the whole fleet, so within a manifest a (protocol, port) pair appears
// once; whether another namespace owns it is the apply's question
// (control/hosts). What a port cannot carry:
//   - the gateway's own ports (store.ReservedPorts): its HTTP and HTTPS,
//     HTTP/3 on udp/443, Caddy's admin, NATS, the mesh, STUN. TLS to a
//     service on 443 is what tls_passthrough is for;
//   - tls_passthrough is TLS, so TCP on the gateway's 443, and has no
//     port of its own to choose;
//   - a service whose only entry points are UDP ports never becomes
//     ready: readiness is a TCP connect to its PORT (an HTTP GET with
//     readiness.path), and a UDP server does not answer one. Such a
//     service must say how it is ready (readiness.path, which it serves
//     on TCP) or also take a TCP entry point.
// A passthrough host is a plain host name (no wildcard: SNI names one
// server, and a wildcard would take every name under it from the HTTPS
// hosts the gateway terminates), normalised as route hosts are, and not
// an HTTP host of the same manifest: the gateway reads the ClientHello
// before it terminates anything, so one of the two would never be served.

// layer4Seen is what the services validated so far expose, to catch two
// services of one manifest asking for the same port or passthrough host.
type layer4Seen struct {
	ports map[store.PortKey]string // the service that asked first
	hosts map[string]string        // passthrough host → service
}

// validateLayer4 checks the service's layer-4 entry points (p is the
// service's path), normalising its passthrough hosts in place.
func validateLayer4(p, name string, s *store.ServiceSpec, seen *layer4Seen, add func(path, format string, args ...any)) {
	if seen.ports == nil {
		seen.ports, seen.hosts = map[store.PortKey]string{}, map[string]string{}
	}
	for _, proto := range []string{store.ProtoTCP, store.ProtoUDP} {
		list := s.TCP
		if proto == store.ProtoUDP {
			list = s.UDP
		}
		mine := map[int]int{} // port → index
		for i, e := range list {
			fp := fmt.Sprintf("%s.%s[%d].port", p, proto, i)
			k := store.PortKey{Proto: proto, Port: e.Port}
			switch {
			case e.Port < 1 || e.Port > 65535:
				add(fp, "must be between 1 and 65535")
				continue
			case k.Reserved():
				add(fp, "%s is reserved: %s", k, reservedWhy(k))
				continue
			}
			if j, ok := mine[e.Port]; ok {
				add(fp, "%s is already at %s[%d]", k, proto, j)
				continue
			}
			mine[e.Port] = i
			if other, ok := seen.ports[k]; ok && other != name {
				add(fp, "%s is already exposed by service %s", k, other)
				continue
			}
			seen.ports[k] = name
		}
	}
	if pt := s.TLSPassthrough; pt != nil {
		if len(pt.Hosts) == 0 {
			add(p+".tls_passthrough.hosts", "at least one host is required")
		}
		mine := map[string]int{}
		for i, h := range pt.Hosts {
			hp := fmt.Sprintf("%s.tls_passthrough.hosts[%d]", p, i)
			norm, err := NormalizeHost(h)
			if err != nil {
				add(hp, "%v", err)
				continue
			}
			if strings.HasPrefix(norm, "*.") {
				add(hp, "host %q: a passthrough host names one server; a wildcard is not allowed", h)
				continue
			}
			pt.Hosts[i] = norm
			if j, ok := mine[norm]; ok {
				add(hp, "host %s is already at hosts[%d]", norm, j)
				continue
			}
			mine[norm] = i
			if other, ok := seen.hosts[norm]; ok && other != name {
				add(hp, "host %s is already passed through to service %s", norm, other)
				continue
			}
			seen.hosts[norm] = name
		}
	}
	if d := time.Duration(s.DrainTimeout); d < 0 || d > store.MaxDrainTimeout {
		add(p+".drain_timeout", "must be between 0 (the default, %s) and %s", store.DefaultDrainTimeout, store.MaxDrainTimeout)
	}
	if len(s.UDP) > 0 && len(s.TCP) == 0 && len(s.Routes) == 0 && len(s.PassthroughHosts()) == 0 && s.Readiness.Path == "" {
		add(p+".udp", "a service reached only over UDP never becomes ready: readiness is a TCP connect to its PORT; "+
			"set readiness.path to an HTTP path it answers on TCP, or also listen on TCP (a tcp entry)")
	}
}

// validatePassthroughHosts refuses a passthrough host that a route of the
// manifest (any service's) also names: run after every service's hosts
// are normalised.
func validatePassthroughHosts(m *store.Manifest, add func(path, format string, args ...any)) {
	http := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		for _, r := range m.Services[name].Routes {
			for _, h := range r.Hosts {
				if _, ok := http[h]; !ok {
					http[h] = name
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		s := m.Services[name]
		for i, h := range s.PassthroughHosts() {
			if other, ok := http[h]; ok {
				add(fmt.Sprintf("services.%s.tls_passthrough.hosts[%d]", name, i),
					"host %s is an HTTP host of service %s: the gateway either terminates TLS for a host or passes it through, not both", h, other)
			}
		}
	}
}

// reservedWhy names what holds a reserved gateway port.
func reservedWhy(k store.PortKey) string {
	switch k {
	case store.PortKey{Proto: store.ProtoTCP, Port: 80}:
		return "the gateway's HTTP port"
	case store.PortKey{Proto: store.ProtoTCP, Port: 443}:
		return "the gateway's HTTPS port; route TLS to a service there with tls_passthrough"
	case store.PortKey{Proto: store.ProtoUDP, Port: 443}:
		return "the gateway's HTTP/3 port"
	case store.PortKey{Proto: store.ProtoTCP, Port: 2019}:
		return "Caddy's admin API"
	case store.PortKey{Proto: store.ProtoTCP, Port: 4222}:
		return "the NATS client port"
	case store.PortKey{Proto: store.ProtoTCP, Port: 6222}:
		return "the NATS cluster port"
	case store.PortKey{Proto: store.ProtoTCP, Port: 7422}:
		return "the NATS leaf node port"
	case store.PortKey{Proto: store.ProtoTCP, Port: 8222}:
		return "the NATS monitoring port"
	case store.PortKey{Proto: store.ProtoUDP, Port: 51820}:
		return "the mesh's WireGuard port"
	case store.PortKey{Proto: store.ProtoUDP, Port: 3478}:
		return "the control server's STUN port"
	}
	return "a port of the gateway's own"
}

// Layer4Entries names every layer-4 entry point m exposes by field path
// ("services.db.tcp[0]": "tcp/5432", "services.db.tls_passthrough":
// "tls passthrough db.example.com"), for a refusal to name them.
func Layer4Entries(m *store.Manifest) map[string]string {
	out := map[string]string{}
	for name, s := range m.Services {
		p := "services." + name
		for i, e := range s.TCP {
			out[fmt.Sprintf("%s.tcp[%d]", p, i)] = store.PortKey{Proto: store.ProtoTCP, Port: e.Port}.String()
		}
		for i, e := range s.UDP {
			out[fmt.Sprintf("%s.udp[%d]", p, i)] = store.PortKey{Proto: store.ProtoUDP, Port: e.Port}.String()
		}
		if hs := s.PassthroughHosts(); len(hs) > 0 {
			out[p+".tls_passthrough"] = "tls passthrough " + strings.Join(hs, ",")
		}
	}
	return out
}
