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
	// NATS is the NATS URL. Default: $EDGEPLANE_NATS, else
	// nats://127.0.0.1:4222.
	NATS string `json:"nats,omitempty"`
	// Creds is a NATS credentials file. Default: none.
	Creds string `json:"creds,omitempty"`
	// Installation scopes RPC names. Default: "local".
	Installation string `json:"installation,omitempty"`
	// Authority scopes every stream and bucket name. Default: "default".
	Authority string `json:"authority,omitempty"`
	// LockTTL is how long a lock outlives a gateway that died holding it;
	// live holders renew every third of it. Default: 20s; minimum 1s.
	LockTTL caddy.Duration `json:"lock_ttl,omitempty"`

	logger *zap.Logger
	names  store.Names

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
	if s.NATS == "" {
		s.NATS = store.URLFromEnv()
	}
	names, err := store.NewNames(s.Installation, s.Authority)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane storage: %w", err)
	}
	s.names = names
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
	nc, err := store.Connect(store.ConnectOptions{URL: s.NATS, CredsFile: s.Creds, Name: "caddy.storage.edgeplane", ReconnectForever: true})
	if err != nil {
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.Open(ctx, nc, s.names)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	cs, err := certs.New(st, certs.Options{LockTTL: time.Duration(s.LockTTL), Logger: s.logger})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	c.nc, c.storage = nc, cs
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
