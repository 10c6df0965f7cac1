// Command caddy is edgeplane's custom Caddy: the standard modules plus
// every edgeplane module (the gateway projection, handler, upstreams, TLS
// permission and admin API, the layer-4 handler and passthrough matcher,
// DNS, and certificate storage on NATS), all registered by importing the
// module root package.
//
//	go build -o caddy ./caddymodule/cmd/caddy
//	./caddy run --config caddy.json
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/edgeplane/edgeplane"

	// caddy-l4's app, listener wrapper and tls matcher, which the
	// gateway's layer-4 ports and TLS passthrough run on (the gateway
	// imports them too; named here so the build says what it carries).
	_ "github.com/mholt/caddy-l4/layer4"
	_ "github.com/mholt/caddy-l4/modules/l4tls"
)

func main() {
	caddycmd.Main()
}
