// Package dnsproj is edgeplane's DNS server. It answers the cluster zone
// (default "edgeplane.internal.") from the routing projection, the same
// in-memory view of committed, routable facts the gateway routes by, and
// hands every other name down a CoreDNS-style chain: a cache, then a
// health-checked forwarder to upstream resolvers (or REFUSED without one).
//
// A server has a region and answers a service's name as a gateway there
// routes it (locality.go): its own region's instances first, the other
// regions' at later SRV priorities, by the service's locality policy and
// the regions' states. A service exposing tcp or udp ports (layer 4) is
// also found by protocol, at _tcp.<service> and _udp.<service>, with the
// same SRV records as _http._tcp.
//
// The package is Caddy-free: caddydns adapts it to a Caddy app that shares
// the gateway's projection in-process, and cmd/edgeplane-dns runs it alone
// on boxes without the gateway.
package dnsproj
