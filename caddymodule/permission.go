package caddymodule

import (
	"context"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
)

func init() {
	caddy.RegisterModule(Permission{})
}

// Permission is `tls.permission.edgeplane`: on-demand TLS may obtain a
// certificate only for a hostname the routing projection routes (exactly
// or through a "*.suffix" route), so strangers cannot make the gateway
// order certificates for names it does not serve.
type Permission struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Permission) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "tls.permission.edgeplane",
		New: func() caddy.Module { return new(Permission) },
	}
}

// Provision attaches to the edgeplane app.
func (p *Permission) Provision(ctx caddy.Context) error {
	app, err := edgeplaneApp(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane TLS permission: %w", err)
	}
	p.app = app
	return nil
}

// CertificateAllowed allows routed hostnames only.
func (p *Permission) CertificateAllowed(_ context.Context, name string) error {
	if p.app.Projection().View().Routes(name) {
		return nil
	}
	return fmt.Errorf("%s: %w: no edgeplane route names this host", name, caddytls.ErrPermissionDenied)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Permission)(nil)
	_ caddytls.OnDemandPermission = (*Permission)(nil)
)
