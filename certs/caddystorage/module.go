// Package caddystorage is the Caddy module caddy.storage.edgeplane: Caddy's
// certificate storage (certificates, ACME accounts, HTTP-01 challenge tokens)
// and its locks in the edgeplane NATS store, so every gateway of a fleet
// shares them, with a local copy of the certificates that serves while the
// store is unreachable. It is a thin adapter over package certs.
package caddystorage

import (
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
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
//
// The module never makes a config fail to load because the store is
// unreachable: it connects in the background, with backoff, and logs one
// line each time the store comes or goes. Meanwhile it serves the
// certificates, keys and OCSP staples it holds in a local copy under Caddy's
// data dir, and refuses writes, locks and therefore issuance with
// store_unavailable. When the store answers again the local copy yields to
// it.
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
	// LocalDir holds the local copy of the certificates, keys and OCSP
	// staples this gateway loads or stores (files 0600), served while the
	// store is unreachable. Default:
	// <caddy data dir>/edgeplane/certs-<installation>-<authority>.
	LocalDir string `json:"local_dir,omitempty"`
	// DisableLocalCopy keeps no local copy: while the store is unreachable,
	// certificates not already in memory cannot be served.
	DisableLocalCopy bool `json:"disable_local_copy,omitempty"`

	logger *zap.Logger

	conn *conn
}

// conn is the module instance's link to the store and the storage on it,
// made on first use. It sits behind a pointer so that the module value
// stays copyable.
type conn struct {
	mu      sync.Mutex
	link    *store.Link
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
	names, err := s.Resolve()
	if err != nil {
		return fmt.Errorf("provisioning edgeplane storage: %w", err)
	}
	if s.LocalDir == "" {
		s.LocalDir = filepath.Join(caddy.AppDataDir(), "edgeplane", fmt.Sprintf("certs-%s-%s", names.Installation, names.Authority))
	}
	s.conn = new(conn)
	if err := registerMetrics(ctx.GetMetricsRegistry(), s.conn); err != nil {
		return fmt.Errorf("provisioning edgeplane storage: registering metrics: %w", err)
	}
	return nil
}

// Validate checks the configuration without I/O.
func (s *Storage) Validate() error {
	if s.LockTTL != 0 && time.Duration(s.LockTTL) < store.MinLeaseTTL {
		return fmt.Errorf("edgeplane storage: lock_ttl %s below the minimum %s", time.Duration(s.LockTTL), store.MinLeaseTTL)
	}
	return nil
}

// CertMagicStorage returns the storage (made once per module instance),
// which starts connecting to the store in the background. It fails only
// for a config that cannot work; an unreachable store is not an error.
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
	link, err := store.NewLink(s.Config, store.LinkOptions{Name: "caddy.storage.edgeplane", OnChange: s.logChange})
	if err != nil {
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	local := s.LocalDir
	if s.DisableLocalCopy {
		local = ""
	}
	cs, err := certs.New(link, certs.Options{LockTTL: time.Duration(s.LockTTL), Logger: s.logger, LocalDir: local})
	if err != nil {
		link.Close()
		return nil, fmt.Errorf("opening edgeplane storage: %w", err)
	}
	c.link, c.storage = link, cs
	return cs, nil
}

// logChange logs each change of the store's reachability once.
func (s *Storage) logChange(st store.LinkState) {
	if st.Connected {
		s.logger.Info("certificate store connected", zap.String("nats", s.NATSURL))
		return
	}
	s.logger.Warn("certificate store unreachable: serving the certificates held locally; issuance, locks and writes fail with store_unavailable until it answers",
		zap.String("nats", s.NATSURL), zap.String("local_copy", s.LocalDir), zap.String("error", st.LastError))
}

// Cleanup closes the link to the store. Locks still held are left to
// expire.
func (s *Storage) Cleanup() error {
	if s.conn == nil {
		return nil
	}
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if s.conn.storage != nil {
		s.conn.storage.Close()
		s.conn.link.Close()
		s.conn.link, s.conn.storage = nil, nil
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
