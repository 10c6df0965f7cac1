package caddycerts

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("edgeplane_certs", parseGlobalApp)
}

// UnmarshalCaddyfile sets up the issuer from Caddyfile tokens. It takes
// every subdirective of the `acme` issuer plus the budget:
//
//	issuer edgeplane [<directory_url>] {
//		budget_limit  <orders>
//		budget_window <duration>
//		# any acme issuer option: email, trusted_roots, ...
//	}
func (iss *Issuer) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the issuer name
	acme := []caddyfile.Token{d.Token()}
	for d.NextArg() {
		acme = append(acme, d.Token())
	}
	opened := false
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if !opened {
			// NextBlock consumed the opening brace: keep it for the
			// acme issuer's parser.
			d.Prev()
			acme = append(acme, d.Token())
			d.Next()
			opened = true
		}
		switch d.Val() {
		case "budget_limit":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 {
				return d.Errf("budget_limit %q: want a whole number of orders, at least 1", d.Val())
			}
			iss.BudgetLimit = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "budget_window":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("budget_window %q: want a positive duration", d.Val())
			}
			iss.BudgetWindow = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			acme = append(acme, d.NextSegment()...)
		}
	}
	if opened {
		acme = append(acme, d.Token()) // the closing brace
	}
	return iss.ACMEIssuer.UnmarshalCaddyfile(caddyfile.NewDispenser(acme))
}

// UnmarshalCaddyfile sets up the app from the global option:
//
//	edgeplane_certs {
//		gateway_name  <name>
//		retry_backoff <first> [<max>]
//		ack_wait      <duration>
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "gateway_name":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.GatewayName = d.Val()
		case "retry_backoff":
			if !d.NextArg() {
				return d.ArgErr()
			}
			first, err := caddy.ParseDuration(d.Val())
			if err != nil || first <= 0 {
				return d.Errf("retry_backoff %q: want a positive duration", d.Val())
			}
			a.RetryBackoff = caddy.Duration(first)
			if d.NextArg() {
				most, err := caddy.ParseDuration(d.Val())
				if err != nil || most < first {
					return d.Errf("retry_backoff maximum %q: want a duration of at least %s", d.Val(), first)
				}
				a.RetryBackoffMax = caddy.Duration(most)
			}
		case "ack_wait":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("ack_wait %q: want a positive duration", d.Val())
			}
			a.AckWait = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized edgeplane_certs option %q", d.Val())
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	if err := a.Validate(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

func parseGlobalApp(d *caddyfile.Dispenser, _ any) (any, error) {
	var a App
	if err := a.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "edgeplane_certs", Value: caddyconfig.JSON(a, nil)}, nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Issuer)(nil)
	_ caddyfile.Unmarshaler = (*App)(nil)
)
