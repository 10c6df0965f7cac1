package caddystorage

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile sets up the storage from Caddyfile tokens:
//
//	storage edgeplane {
//		nats_url     <url>
//		creds_file   <file>
//		installation <name>
//		authority    <name>
//		lock_ttl     <duration>
//	}
//
// The former spellings nats and creds are read as nats_url and creds_file.
func (s *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		if opt == "lock_ttl" {
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("parsing lock_ttl: %v", err)
			}
			s.LockTTL = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
			continue
		}
		dst := s.Setting(opt)
		switch opt {
		case "nats":
			dst = s.Setting("nats_url")
		case "creds":
			dst = s.Setting("creds_file")
		}
		if dst == nil {
			return d.Errf("unrecognized edgeplane storage option %q", opt)
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	if s.LockTTL != 0 && time.Duration(s.LockTTL) < time.Second {
		return d.Errf("lock_ttl %s below the minimum 1s", time.Duration(s.LockTTL))
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Storage)(nil)
