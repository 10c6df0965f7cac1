// Package edgeplane registers every edgeplane Caddy module. Importing it is
// what `xcaddy build --with github.com/edgeplane/edgeplane` does, and what
// caddymodule/cmd/caddy does.
package edgeplane

import (
	// The gateway: edgeplane app, http.handlers.edgeplane,
	// http.reverse_proxy.upstreams.edgeplane, tls.permission.edgeplane,
	// admin.api.edgeplane.
	_ "github.com/edgeplane/edgeplane/caddymodule"
	// Fleet-wide ACME budget (tls.issuance.edgeplane) and visible renewal
	// (edgeplane_certs).
	_ "github.com/edgeplane/edgeplane/certs/caddycerts"
	// Certificate storage on NATS KV.
	_ "github.com/edgeplane/edgeplane/certs/caddystorage"
	// DNS from the same projection.
	_ "github.com/edgeplane/edgeplane/dnsproj/caddydns"
	// `caddy supervise`: the gateway swapped for a new process without
	// dropping a request.
	_ "github.com/edgeplane/edgeplane/caddymodule/supervise"
)
