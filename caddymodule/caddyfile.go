package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgeplane/edgeplane/store"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("edgeplane", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("edgeplane", parseHandlerDirective)
	// The gateway is a terminal handler like reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("edgeplane", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobalOption sets up the edgeplane app:
//
//	{
//		edgeplane {
//			nats_url      <url>
//			creds_file    <path>
//			installation  <name>
//			authority     <name>
//			tls_ca_file   <path>
//			trust_root    <key>
//			snapshot_path <path>
//			gateway_name  <name>
//			region        <name>
//			health_interval <duration>
//			health_timeout  <duration>
//			disable_health_checks
//			traffic_interval <duration>
//			region_probe_interval <duration>
//			layer4_bind <ip>
//			disable_layer4
//			disable_access_log
//			access_log_rate <lines per second per service>
//		}
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("edgeplane global option given more than once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "edgeplane", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile reads the body of the `edgeplane` global option.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		sub := d.Val()
		switch sub {
		case "disable_health_checks", "disable_layer4", "disable_access_log":
			if d.NextArg() {
				return d.ArgErr()
			}
			switch sub {
			case "disable_layer4":
				a.DisableLayer4 = true
			case "disable_access_log":
				a.DisableAccessLog = true
			default:
				a.DisableHealthChecks = true
			}
			continue
		case "access_log_rate":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 0 {
				return d.Errf("edgeplane option access_log_rate: want a number of lines a second (0 or more), got %q", d.Val())
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			a.AccessLogRate = &n
			continue
		case "health_interval", "health_timeout", "traffic_interval", "region_probe_interval":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("edgeplane option %s: %v", sub, err)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			switch sub {
			case "health_interval":
				a.HealthInterval = caddy.Duration(dur)
			case "health_timeout":
				a.HealthTimeout = caddy.Duration(dur)
			case "region_probe_interval":
				probe := caddy.Duration(dur)
				a.RegionProbeInterval = &probe
			default:
				a.TrafficInterval = caddy.Duration(dur)
			}
			continue
		}
		dst := a.Setting(sub)
		switch sub {
		case "snapshot_path":
			dst = &a.SnapshotPath
		case "gateway_name":
			dst = &a.GatewayName
		case "region":
			dst = &a.Region
		case "layer4_bind":
			dst = &a.Layer4Bind
		}
		if dst == nil {
			return d.Errf("unrecognized edgeplane option %q", sub)
		}
		if *dst != "" {
			return d.Errf("edgeplane option %q given more than once", sub)
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if sub == "region" && !store.ValidRegion(a.Region) {
			return d.Errf("edgeplane option region: %q is not a DNS label", a.Region)
		}
	}
	return nil
}

// parseHandlerDirective sets up the gateway handler:
//
//	edgeplane {
//		<any reverse_proxy subdirective except upstreams and dynamic>
//	}
func parseHandlerDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	gw := new(Handler)
	if err := gw.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if err := gw.Handler.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	return gw, nil
}

// UnmarshalCaddyfile reads the `edgeplane` directive: reverse_proxy's
// subdirectives, without upstreams of its own.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if err := h.Handler.UnmarshalCaddyfile(d); err != nil {
		return err
	}
	if len(h.Upstreams) > 0 || h.DynamicUpstreamsRaw != nil {
		return d.Err("edgeplane takes no upstreams ('to' or 'dynamic'): they come from the routing projection")
	}
	return nil
}

// UnmarshalCaddyfile reads `dynamic edgeplane [<namespace> <service>]`.
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	args := d.RemainingArgs()
	switch len(args) {
	case 0:
	case 2:
		u.Namespace, u.Service = args[0], args[1]
	default:
		return d.Errf("dynamic edgeplane takes no arguments or <namespace> <service>, got %d", len(args))
	}
	if d.NextBlock(0) {
		return d.Errf("dynamic edgeplane takes no block (found %q)", d.Val())
	}
	return nil
}

// UnmarshalCaddyfile reads `permission edgeplane`.
func (p *Permission) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("permission edgeplane takes no block (found %q)", d.Val())
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler = (*Permission)(nil)
	_ caddy.Module          = (*Handler)(nil)
)
