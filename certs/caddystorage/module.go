// Package caddystorage is the Caddy module caddy.storage.edgeplane: Caddy's
// certificate storage (certificates, ACME accounts, HTTP-01 challenge tokens)
// and its locks in the edgeplane NATS store, so every gateway of a fleet
// shares them. It is a thin adapter over package certs.
package caddystorage

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(Storage{})
}

// Storage keeps Caddy's TLS assets in the edgeplane store (KV bucket
// cp_certs_<authority>) and takes certmagic's locks as store leases
// (cp.lock.cert.<host>, cp.lock.acme_account.<contact>), so one gateway
// places each ACME order and any gateway can answer its HTTP-01 challenge.
// The buckets must already exist: `control server` provisions them.
type Storage struct {
	// The control plane's store: nats_url, creds_file, installation and
	// authority, as in every edgeplane module.
	store.Config
	// NATS is the former spelling of nats_url.
	//
	// Deprecated: use nats_url; it is read as such, with a warning.
	NATS string `json:"nats,omitempty"`
	// Creds is the former spelling of creds_file.
	//
	// Deprecated: use creds_file; it is read as such, with a warning.
	Creds string `json:"creds,omitempty"`
	// LockTTL is how long a lock outlives a gateway that died holding it;
	// live holders renew every third of it. Default: 20s; minimum 1s.
	LockTTL caddy.Duration `json:"lock_ttl,omitempty"`

	logger *zap.Logger

	conn *conn
}

// conn is the module instance's connection, made on first use. It sits
// behind a pointer so that the module value stays copyable.
type conn struct {
	mu      sync.Mutex
	nc      *nats.Conn
	storage *certs.Storage
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.edgeplane",
		New: func() caddy.Module { return new(Storage) },
	}
}

// Provision fills defaults.
func (s *Storage) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	for _, old := range []struct{ name, value, setting string }{{"nats", s.NATS, "nats_url"}, {"creds", s.Creds, "creds_file"}} {
		if old.value == "" {
			continue
		}
		dst := s.Setting(old.setting)
		if *dst != "" && *dst != old.value {
			return fmt.Errorf("provisioning edgeplane storage: %s and %s disagree (%q, %q): keep %s", old.name, old.setting, old.value, *dst, old.setting)
		}
		*dst = old.value
		s.logger.Warn("deprecated storage setting: rename it", zap.String("setting", old.name), zap.String("use", old.setting))
	}
	s.NATS, s.Creds = "", ""
	if _, err := s.Resolve(); err != nil {
		return fmt.Errorf("provisioning edgeplane storage: %w", err)
	}
	s.conn = new(conn)
	return nil
}

// Validate checks the configuration without I/O.
func (s *Storage) Validate() error {
	if s.LockTTL != 0 && time.Duration(s.LockTTL) < store.MinLeaseTTL {
		return fmt.Errorf("edgeplane storage: lock_ttl %s below the minimum %s", time.Duration(s.LockTTL), store.MinLeaseTTL)
	}
	return nil
}

// CertMagicStorage connects to NATS (once per module instance) and returns
// the storage.
func (s *Storage) CertMagicStorage() (certmagic.Storage, error) {
	if s.conn == nil {
		return nil, fmt.Errorf("opening edgeplane storage: module not provisioned")
	}
	c := s.conn
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storage != nil {
		return c.storage, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.Dial(ctx, store.ConnectOptions{Name: "caddy.storage.edgeplane", ReconnectForever: true})
	if err != nil {
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	cs, err := certs.New(st, certs.Options{LockTTL: time.Duration(s.LockTTL), Logger: s.logger})
	if err != nil {
		st.NC.Close()
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	c.nc, c.storage = st.NC, cs
	return cs, nil
}

// Cleanup closes the NATS connection. Locks still held are left to expire.
func (s *Storage) Cleanup() error {
	if s.conn == nil {
		return nil
	}
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if s.conn.nc != nil {
		s.conn.nc.Close()
		s.conn.nc, s.conn.storage = nil, nil
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner      = (*Storage)(nil)
	_ caddy.Validator        = (*Storage)(nil)
	_ caddy.CleanerUpper     = (*Storage)(nil)
	_ caddy.StorageConverter = (*Storage)(nil)
)
