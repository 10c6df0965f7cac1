// Package caddycerts holds the Caddy modules that put a gateway's ACME work
// under fleet-wide control: the issuer `tls.issuance.edgeplane` (Caddy's
// ACME issuer behind the fleet's order budget) and the app `edgeplane_certs`
// (renewal as visible work: it records every certificate this gateway
// obtains or fails to obtain, and takes scheduled renewal items from
// JetStream). Both need the `caddy.storage.edgeplane` storage, whose NATS
// connection they share. They are thin adapters over package certs.
package caddycerts

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the `edgeplane_certs` app. It runs this gateway's share of the
// fleet's renewal work (one durable JetStream consumer for all gateways, so
// each scheduled renewal is worked once, under the host's lock) and
// subscribes itself to the TLS app's `cert_obtained` and `cert_failed`
// events, so every certificate any gateway obtains gets a status record
// (`control certs`) and a scheduled renewal.
//
// The app is loaded by the `edgeplane` issuer even when the config does not
// name it; configure it only to change the defaults below.
type App struct {
	// GatewayName names this gateway in certificate status records.
	// Default: the host name.
	GatewayName string `json:"gateway_name,omitempty"`
	// RetryBackoff is the wait before retrying a failed renewal; it
	// doubles with each consecutive failure. Default: 1m.
	RetryBackoff caddy.Duration `json:"retry_backoff,omitempty"`
	// RetryBackoffMax caps RetryBackoff. Default: 6h (or RetryBackoff, if
	// that is longer).
	RetryBackoffMax caddy.Duration `json:"retry_backoff_max,omitempty"`
	// AckWait was how long one renewal attempt may go without reporting
	// progress before another gateway takes the item over.
	//
	// Deprecated: the control plane provisions the fleet's renewal
	// consumer (a gateway may create none) with a 2m ack wait; the worker
	// reports every third of that. A value here is checked, logged and
	// otherwise ignored.
	AckWait caddy.Duration `json:"ack_wait,omitempty"`

	storage *certs.Storage
	renewer *certs.Renewer
	logger  *zap.Logger

	// issuers is behind a pointer so the module value stays copyable.
	issuers *issuerSet

	cancel context.CancelFunc
	done   chan struct{}
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "edgeplane_certs",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision binds the app to the edgeplane storage and subscribes it to
// the certificate events.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.issuers = new(issuerSet)
	cs, err := edgeplaneStorage(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane_certs: %w", err)
	}
	a.storage = cs
	cs.SetRefreshed(a.reload)
	if a.AckWait != 0 {
		a.logger.Warn("edgeplane_certs ack_wait is ignored: the control plane sets the renewal consumer's ack wait",
			zap.Duration("ack_wait", time.Duration(a.AckWait)), zap.Duration("in_use", store.RenewalsAckWait))
	}
	if a.GatewayName == "" {
		a.GatewayName = store.HostName("gateway")
	}
	if a.RetryBackoff == 0 {
		a.RetryBackoff = caddy.Duration(time.Minute)
	}
	if a.RetryBackoffMax == 0 {
		a.RetryBackoffMax = max(caddy.Duration(6*time.Hour), a.RetryBackoff)
	}
	first, most := time.Duration(a.RetryBackoff), time.Duration(a.RetryBackoffMax)
	a.renewer, err = certs.NewRenewer(certs.RenewerConfig{
		Link:    cs.Link(),
		Renew:   a.renew,
		Name:    a.GatewayName,
		Logger:  a.logger,
		AckWait: time.Duration(a.AckWait),
		Backoff: func(attempt int) time.Duration {
			d := first
			for i := 1; i < attempt && d < most; i++ {
				d *= 2
			}
			return min(d, most)
		},
	})
	if err != nil {
		return fmt.Errorf("provisioning edgeplane_certs: %w", err)
	}
	// Subscribing here, rather than asking for an events.handlers module
	// in the config, means no gateway can run the issuer without its
	// certificates being recorded.
	evIface, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("provisioning edgeplane_certs: loading the events app: %w", err)
	}
	ev := evIface.(*caddyevents.App)
	for _, name := range []string{"cert_obtained", "cert_failed"} {
		if err := ev.On(name, eventHandler{a}); err != nil {
			return fmt.Errorf("provisioning edgeplane_certs: subscribing to %s: %w", name, err)
		}
	}
	return nil
}

// Validate checks the configuration without I/O.
func (a *App) Validate() error {
	switch {
	case a.RetryBackoff < 0 || a.RetryBackoffMax < 0 || a.AckWait < 0:
		return fmt.Errorf("edgeplane_certs: durations must not be negative")
	case a.RetryBackoffMax != 0 && a.RetryBackoffMax < a.RetryBackoff:
		return fmt.Errorf("edgeplane_certs: retry_backoff_max %s is shorter than retry_backoff %s",
			time.Duration(a.RetryBackoffMax), time.Duration(a.RetryBackoff))
	case a.AckWait != 0 && time.Duration(a.AckWait) < 3*time.Second:
		return fmt.Errorf("edgeplane_certs: ack_wait %s is below the minimum 3s", time.Duration(a.AckWait))
	}
	return nil
}

// Start runs the renewal worker until Stop.
func (a *App) Start() error {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan struct{})
	go func() {
		defer close(a.done)
		a.run(ctx)
	}()
	a.logger.Info("certificate renewal worker running", zap.String("gateway", a.GatewayName))
	return nil
}

// run keeps the worker up: a failure to create the shared consumer (NATS
// down at start) is retried, not fatal, since certificates already in the
// cache keep being served meanwhile.
func (a *App) run(ctx context.Context) {
	wait := time.Second
	for {
		err := a.renewer.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		a.logger.Error("certificate renewal worker stopped; restarting", zap.Duration("in", wait), zap.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, time.Minute)
	}
}

// Stop ends the renewal worker; an item it was working is handed back to
// the fleet.
func (a *App) Stop() error {
	if a.cancel == nil {
		return nil
	}
	a.cancel()
	<-a.done
	a.cancel = nil
	return nil
}

// issuerSet is the edgeplane issuers of one config.
type issuerSet struct {
	mu   sync.Mutex
	list []*Issuer
}

// register makes iss's certmagic config available to renewal work.
func (a *App) register(iss *Issuer) {
	a.issuers.mu.Lock()
	defer a.issuers.mu.Unlock()
	a.issuers.list = append(a.issuers.list, iss)
}

// reload loads into memory the certificates the local copy just took from
// the store (renewed by another gateway while this one could not reach the
// store), so that the newest is served at once.
func (a *App) reload(ctx context.Context, names []string) {
	for _, name := range names {
		cfg, err := a.configFor(ctx, name)
		if err != nil {
			continue // removed elsewhere, or not one of ours
		}
		if _, err := cfg.CacheManagedCertificate(ctx, name); err != nil {
			a.logger.Warn("loading a certificate renewed elsewhere", zap.String("name", name), zap.Error(err))
			continue
		}
		a.logger.Info("loaded a certificate renewed elsewhere while the store was unreachable", zap.String("name", name))
	}
}

// errNoCertificate is wrapped when a renewal item names a host that no
// edgeplane issuer of this gateway holds a certificate for.
var errNoCertificate = errors.New("no certificate to renew")

// configFor picks the certmagic config whose issuer holds host's
// certificate in storage.
func (a *App) configFor(ctx context.Context, host string) (*certmagic.Config, error) {
	a.issuers.mu.Lock()
	issuers := append([]*Issuer(nil), a.issuers.list...)
	a.issuers.mu.Unlock()
	for _, iss := range issuers {
		cfg := iss.config()
		if cfg == nil {
			continue
		}
		for _, ci := range cfg.Issuers {
			if a.storage.Exists(ctx, certmagic.StorageKeys.SiteCert(ci.IssuerKey(), host)) {
				return cfg, nil
			}
		}
	}
	return nil, fmt.Errorf("renewing %s: %w under any tls.issuance.edgeplane issuer of this gateway (%d configured)",
		host, errNoCertificate, len(issuers))
}

func (a *App) renew(ctx context.Context, item certs.RenewalItem) (certs.RenewResult, error) {
	cfg, err := a.configFor(ctx, item.Host)
	if err != nil {
		return certs.RenewResult{}, err
	}
	return certs.CertmagicRenew(cfg)(ctx, item)
}

// ours reports whether a certificate event names an issuer key of one of
// this config's edgeplane issuers ("issuer" on cert_obtained, "issuers" on
// cert_failed).
func (a *App) ours(data map[string]any) bool {
	keys, _ := data["issuers"].([]string)
	if k, ok := data["issuer"].(string); ok {
		keys = append(keys, k)
	}
	a.issuers.mu.Lock()
	defer a.issuers.mu.Unlock()
	for _, iss := range a.issuers.list {
		if iss.config() == nil {
			continue // IssuerKey needs the config Caddy sets
		}
		for _, k := range keys {
			if k == iss.IssuerKey() {
				return true
			}
		}
	}
	return false
}

// eventHandler records certificate events through the app's renewer.
type eventHandler struct{ a *App }

// Handle records e. Events arrive synchronously inside certmagic's obtain
// and renew, so the store gets a bounded time; a failure is logged and never
// fails the certificate operation.
func (h eventHandler) Handle(ctx context.Context, e caddy.Event) error {
	if !h.a.ours(e.Data) {
		// A certificate of another policy's issuer: this app could not
		// renew it, so it does not take it on.
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := h.a.renewer.HandleEvent(ctx, h.a.storage, e.Name(), e.Data)
	switch {
	case store.HasCode(err, store.CodeStoreUnavailable):
		// The outage itself is logged once, by the storage; a failure it
		// caused cannot be recorded until the store is back.
		if c := h.a.logger.Check(zapcore.DebugLevel, "certificate event not recorded: the store is unreachable"); c != nil {
			c.Write(zap.String("event", e.Name()), zap.Error(err))
		}
	case err != nil:
		h.a.logger.Error("recording certificate event", zap.String("event", e.Name()), zap.Error(err))
	}
	return nil
}

// edgeplaneStorage returns the config's storage if it is the edgeplane one.
func edgeplaneStorage(ctx caddy.Context) (*certs.Storage, error) {
	st := ctx.Storage()
	cs, ok := st.(*certs.Storage)
	if !ok {
		return nil, fmt.Errorf(`needs the edgeplane certificate storage (top-level "storage": {"module": "edgeplane"}, Caddyfile global option "storage edgeplane"), but the storage is %T`, st)
	}
	return cs, nil
}

// Interface guards
var (
	_ caddy.App           = (*App)(nil)
	_ caddy.Provisioner   = (*App)(nil)
	_ caddy.Validator     = (*App)(nil)
	_ caddyevents.Handler = eventHandler{}
)
