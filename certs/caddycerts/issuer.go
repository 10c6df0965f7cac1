package caddycerts

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/certs"
)

func init() {
	caddy.RegisterModule(Issuer{})
}

// Issuer is `tls.issuance.edgeplane`: Caddy's ACME issuer (every field of
// `tls.issuance.acme` is accepted inline, with the same meaning and
// defaults) behind the fleet-wide ACME order budget. Before an order
// reaches the CA it is counted, atomically in NATS KV, against its
// registered domain; an order past the budget fails with a
// budget_exhausted error naming the domain and when the next order fits,
// instead of spending the CA's rate limit.
//
// It stays an ACME issuer for the rest of Caddy: the HTTP app fills in its
// challenge ports and answers HTTP-01 challenges through it (it implements
// GetACMEIssuer), certificates are stored under the ACME CA's issuer key,
// and any gateway can answer a challenge another one started (the tokens
// live in the edgeplane storage).
//
// It also normalises certificate subjects (lower case, no trailing dot,
// IDNA A-labels) in its automation policy before certmagic names locks and
// storage keys, and loads the `edgeplane_certs` app, which records every
// certificate and schedules its renewal. It needs the `caddy.storage.edgeplane`
// storage.
type Issuer struct {
	caddytls.ACMEIssuer

	// BudgetLimit is how many ACME orders the whole fleet may place per
	// registered domain (public suffix plus one label) within BudgetWindow.
	// Every gateway must use the same value. Default: 50, Let's Encrypt's
	// published limit of new certificates per registered domain.
	BudgetLimit int `json:"budget_limit,omitempty"`
	// BudgetWindow is the sliding window of BudgetLimit. Default: 168h
	// (7 days).
	BudgetWindow caddy.Duration `json:"budget_window,omitempty"`

	budget  *certs.Budget
	storage *certs.Storage
	logger  *zap.Logger
	// magic is behind a pointer so the module value stays copyable.
	magic *configHolder
}

// configHolder is the certmagic config Caddy last handed to an issuer.
type configHolder struct {
	mu  sync.Mutex
	cfg *certmagic.Config
	// guarded is the on-demand config whose decision already asks the
	// store (SetConfig may see the same one again).
	guarded *certmagic.OnDemandConfig
}

// CaddyModule returns the Caddy module information.
func (Issuer) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "tls.issuance.edgeplane",
		New: func() caddy.Module { return new(Issuer) },
	}
}

// Provision sets up the ACME issuer, the budget on the edgeplane store and
// the registration with the edgeplane_certs app.
func (iss *Issuer) Provision(ctx caddy.Context) error {
	iss.logger = ctx.Logger()
	// Caddy validates after provisioning; the budget needs valid
	// settings now, and its errors should name the config fields.
	if err := iss.Validate(); err != nil {
		return err
	}
	if iss.magic == nil {
		iss.magic = new(configHolder)
	}
	if err := iss.ACMEIssuer.Provision(ctx); err != nil {
		return fmt.Errorf("provisioning edgeplane issuer: %w", err)
	}
	cs, err := edgeplaneStorage(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane issuer: %w", err)
	}
	iss.storage = cs
	iss.budget, err = certs.NewBudget(cs.Link(), certs.BudgetOptions{
		Limit: iss.BudgetLimit, Window: time.Duration(iss.BudgetWindow),
	})
	if err != nil {
		return fmt.Errorf("provisioning edgeplane issuer: %w", err)
	}
	appIface, err := ctx.App("edgeplane_certs")
	if err != nil {
		return fmt.Errorf("provisioning edgeplane issuer: loading the edgeplane_certs app: %w", err)
	}
	appIface.(*App).register(iss)
	return nil
}

// Validate checks the budget settings without I/O.
func (iss *Issuer) Validate() error {
	if iss.BudgetLimit < 0 {
		return fmt.Errorf("edgeplane issuer: budget_limit %d is negative", iss.BudgetLimit)
	}
	if iss.BudgetWindow < 0 {
		return fmt.Errorf("edgeplane issuer: budget_window %s is negative", time.Duration(iss.BudgetWindow))
	}
	return nil
}

// SetConfig hands cfg to the ACME issuer (which needs it to solve
// challenges) and keeps it for renewal work. It also installs subject
// normalisation and newest-certificate selection on cfg unless something
// else already does them, and makes cfg's on-demand decision refuse a name
// at once while the store is unreachable and the local copy holds no
// certificate for it.
// Caddy calls it again whenever it rebuilds the policy's config.
func (iss *Issuer) SetConfig(cfg *certmagic.Config) {
	if cfg.SubjectTransformer == nil {
		cfg.SubjectTransformer = normalizeSubject
	}
	if cfg.CertSelection == nil {
		cfg.CertSelection = newestCertificate{}
	}
	iss.ACMEIssuer.SetConfig(cfg)
	if iss.magic == nil {
		iss.magic = new(configHolder)
	}
	iss.magic.mu.Lock()
	iss.magic.cfg = cfg
	if ond := cfg.OnDemand; ond != nil && ond.DecisionFunc != nil && ond != iss.magic.guarded && iss.storage != nil {
		// An on-demand issuance the fleet cannot agree on (no lock, no
		// budget) is refused before certmagic starts it: it fails the
		// handshake at once, names the host in the log, and no order
		// reaches the CA.
		decide, storage := ond.DecisionFunc, iss.storage
		ond.DecisionFunc = func(ctx context.Context, name string) error {
			if err := decide(ctx, name); err != nil {
				return err
			}
			return storage.RefuseIssuance(ctx, name)
		}
		iss.magic.guarded = ond
	}
	iss.magic.mu.Unlock()
}

// config is the policy's certmagic config, nil before SetConfig.
func (iss *Issuer) config() *certmagic.Config {
	if iss.magic == nil {
		return nil
	}
	iss.magic.mu.Lock()
	defer iss.magic.mu.Unlock()
	return iss.magic.cfg
}

// normalizeSubject is certs.NormalizeHost for certmagic: a name it cannot
// normalise is left as it is, for certmagic to refuse or handle.
func normalizeSubject(_ context.Context, name string) string {
	if h, err := certs.NormalizeHost(name); err == nil {
		return h
	}
	return name
}

// Issue charges the fleet budget for csr's registered domains, then places
// the order.
func (iss *Issuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	return certs.BudgetIssuer{Issuer: &iss.ACMEIssuer, Budget: iss.budget}.Issue(ctx, csr)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Issuer)(nil)
	_ caddy.Validator             = (*Issuer)(nil)
	_ caddytls.ConfigSetter       = (*Issuer)(nil)
	_ certmagic.Issuer            = (*Issuer)(nil)
	_ certmagic.PreChecker        = (*Issuer)(nil)
	_ certmagic.Revoker           = (*Issuer)(nil)
	_ certmagic.RenewalInfoGetter = (*Issuer)(nil)
	_ interface {
		GetACMEIssuer() *caddytls.ACMEIssuer
	} = (*Issuer)(nil)
)
