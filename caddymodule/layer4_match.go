package caddymodule

import (
	"crypto/tls"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	// caddy-l4's `tls` matcher (layer4.matchers.tls), which runs this
	// matcher on the HTTPS listener: passthrough needs it in every build
	// that has the gateway.
	_ "github.com/mholt/caddy-l4/modules/l4tls"
)

func init() {
	caddy.RegisterModule(PassthroughMatcher{})
}

// PassthroughMatcher is `tls.handshake_match.edgeplane_passthrough`: it
// matches a ClientHello whose server name is a tls_passthrough host of
// the current routing view. On the HTTPS listener, inside caddy-l4's
// listener wrapper and `tls` matcher, it sends those connections to
// `layer4.handlers.edgeplane` unterminated; every other connection falls
// through to Caddy's own TLS (an unknown server name then gets Caddy's
// handshake refusal).
type PassthroughMatcher struct {
	shared *sharedProjection
}

// CaddyModule returns the Caddy module information.
func (PassthroughMatcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "tls.handshake_match.edgeplane_passthrough",
		New: func() caddy.Module { return new(PassthroughMatcher) },
	}
}

// Provision attaches to the edgeplane app's projection.
func (m *PassthroughMatcher) Provision(ctx caddy.Context) error {
	app, err := edgeplaneApp(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane passthrough matcher: %w", err)
	}
	m.shared = app.shared
	return nil
}

// Match reports whether hello's server name is a passthrough host now.
func (m *PassthroughMatcher) Match(hello *tls.ClientHelloInfo) bool {
	_, ok := m.shared.proj.View().Layer4().Passthrough(hello.ServerName)
	return ok
}

// UnmarshalCaddyfile reads `edgeplane_passthrough` (no arguments).
func (m *PassthroughMatcher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the matcher name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("edgeplane_passthrough takes no block (found %q)", d.Val())
	}
	return nil
}

// UnmarshalCaddyfile reads the layer-4 handler:
//
//	edgeplane [<namespace> <service>] {
//		port         <tcp/N|udp/N>
//		dial_timeout <duration>
//	}
func (h *L4Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the handler name
	switch args := d.RemainingArgs(); len(args) {
	case 0:
	case 2:
		h.Namespace, h.Service = args[0], args[1]
	default:
		return d.Errf("edgeplane takes no arguments or <namespace> <service>, got %d", len(args))
	}
	for d.NextBlock(0) {
		sub := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		switch sub {
		case "port":
			h.Port = d.Val()
		case "dial_timeout":
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("edgeplane dial_timeout: %v", err)
			}
			h.DialTimeout = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized edgeplane layer-4 option %q", sub)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner          = (*PassthroughMatcher)(nil)
	_ caddytls.ConnectionMatcher = (*PassthroughMatcher)(nil)
	_ caddyfile.Unmarshaler      = (*PassthroughMatcher)(nil)
	_ caddyfile.Unmarshaler      = (*L4Handler)(nil)
)
