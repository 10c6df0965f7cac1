package caddydns

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/edgeplane/edgeplane/dnsproj"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("edgeplane_dns", parseGlobalOption)
}

// parseGlobalOption sets up the app from the Caddyfile global option:
//
//	edgeplane_dns {
//	    listen <host:port>...
//	    zone <zone>
//	    region <region>
//	    ttl <duration>
//	    ns_address <ip>...
//	    forward <ip[:port]>... {
//	        policy sequential|random
//	        timeout <duration>
//	        health_check <duration>
//	        max_fails <n>
//	    }
//	    cache off | cache {
//	        size <n>
//	        max_ttl <duration>
//	        max_negative_ttl <duration>
//	    }
//	    max_udp_size <bytes>
//	    max_query_size <bytes>
//	}
func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "edgeplane_dns", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile reads the global option's block.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "listen":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.Listen = append(a.Listen, args...)
		case "zone":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.Zone = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "region":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if err := dnsproj.ValidRegion(d.Val()); err != nil {
				return d.Errf("%v", err)
			}
			a.Region = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "ttl":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			a.TTL = dur
		case "ns_address":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.NSAddresses = append(a.NSAddresses, args...)
		case "forward":
			if a.Forward == nil {
				a.Forward = new(Forward)
			}
			if err := a.Forward.unmarshal(d); err != nil {
				return err
			}
		case "cache":
			if a.Cache == nil {
				a.Cache = new(Cache)
			}
			if err := a.Cache.unmarshal(d); err != nil {
				return err
			}
		case "max_udp_size":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			a.MaxUDPSize = n
		case "max_query_size":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			a.MaxQuerySize = n
		default:
			return d.Errf("unrecognized edgeplane_dns option %q", d.Val())
		}
	}
	return nil
}

func (f *Forward) unmarshal(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.Err("forward needs at least one upstream resolver")
	}
	f.To = append(f.To, args...)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "policy":
			if !d.NextArg() {
				return d.ArgErr()
			}
			f.Policy = d.Val()
			if f.Policy != "sequential" && f.Policy != "random" {
				return d.Errf("forward policy %q: must be sequential or random", f.Policy)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "timeout":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			f.Timeout = dur
		case "health_check":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			f.HealthCheck = dur
		case "max_fails":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			f.MaxFails = n
		default:
			return d.Errf("unrecognized forward option %q", d.Val())
		}
	}
	return nil
}

func (c *Cache) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		if d.Val() != "off" {
			return d.Errf("cache %q: the only argument is off", d.Val())
		}
		c.Disabled = true
		if d.NextArg() {
			return d.ArgErr()
		}
		return nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "size":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			c.Size = n
		case "max_ttl":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			c.MaxTTL = dur
		case "max_negative_ttl":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			c.MaxNegativeTTL = dur
		default:
			return d.Errf("unrecognized cache option %q", d.Val())
		}
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return 0, d.Errf("%s %q: %v", name, d.Val(), err)
	}
	if dur <= 0 || dur > 24*time.Hour {
		return 0, d.Errf("%s %q: must be positive and at most 24h", name, d.Val())
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return caddy.Duration(dur), nil
}

func intArg(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n <= 0 {
		return 0, d.Errf("%s %q: must be a positive integer", name, d.Val())
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return n, nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*App)(nil)
