// Command caddy is edgeplane's custom Caddy: the standard modules plus
// every edgeplane module (the gateway projection, handler, upstreams, TLS
// permission and admin API, DNS, and certificate storage on NATS), all
// registered by importing the module root package.
//
//	go build -o caddy ./caddymodule/cmd/caddy
//	./caddy run --config caddy.json
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/edgeplane/edgeplane"
)

func main() {
	caddycmd.Main()
}
