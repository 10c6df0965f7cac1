package certs

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/net/publicsuffix"

	"github.com/edgeplane/edgeplane/store"
)

// Let's Encrypt's published limit on new certificates per registered domain
// (https://letsencrypt.org/docs/rate-limits/): 50 per 7 days.
const (
	DefaultBudgetLimit  = 50
	DefaultBudgetWindow = 7 * 24 * time.Hour
)

// CodeBudgetExhausted is the structured error code of an order refused
// because the fleet spent its ACME budget for the registered domain.
const CodeBudgetExhausted = "budget_exhausted"

// BudgetOptions size the fleet-wide ACME order budget.
type BudgetOptions struct {
	// Limit is the number of orders per registered domain per Window;
	// default DefaultBudgetLimit.
	Limit int
	// Window is the sliding window; default DefaultBudgetWindow.
	Window time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Budget counts ACME orders per registered domain across the whole fleet in
// the store's ACME budget bucket, so that the gateways together stay under
// the CA's rate limit instead of each spending it separately. Every order
// is counted, failed or not: it is the cautious reading of the CA's limits.
type Budget struct {
	link *store.Link
	opts BudgetOptions
}

// budgetRecord is the wire record under KeySafe(registered domain): the
// times of the orders placed within the window.
type budgetRecord struct {
	Version int         `json:"version"`
	Domain  string      `json:"domain"`
	Orders  []time.Time `json:"orders"`
	Hosts   []string    `json:"hosts,omitempty"` // host of each order, same index
}

// NewBudget returns the budget in the ACME budget bucket of the store l
// binds. While the store is unreachable every charge fails with
// store_unavailable: an order nobody counted never reaches the CA.
func NewBudget(l *store.Link, o BudgetOptions) (*Budget, error) {
	if l == nil {
		return nil, fmt.Errorf("creating acme budget: no store link")
	}
	if o.Limit == 0 {
		o.Limit = DefaultBudgetLimit
	}
	if o.Limit < 0 {
		return nil, fmt.Errorf("creating acme budget: limit %d is negative", o.Limit)
	}
	if o.Window == 0 {
		o.Window = DefaultBudgetWindow
	}
	if o.Window < 0 {
		return nil, fmt.Errorf("creating acme budget: window %s is negative", o.Window)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Budget{link: l, opts: o}, nil
}

// RegisteredDomain is the domain a CA's per-domain limit counts against:
// the public suffix plus one label ("shop.example.co.uk" -> "example.co.uk").
// An IP address, or a name that is itself a public suffix, counts as itself.
func RegisteredDomain(host string) (string, error) {
	h, err := NormalizeHost(host)
	if err != nil {
		return "", err
	}
	h = strings.TrimPrefix(h, "*.")
	if _, err := netip.ParseAddr(h); err == nil {
		return h, nil
	}
	d, err := publicsuffix.EffectiveTLDPlusOne(h)
	if err != nil {
		return h, nil
	}
	return d, nil
}

// Usage is a domain's spend in the current window.
type Usage struct {
	Domain string    `json:"domain"`
	Used   int       `json:"used"`
	Limit  int       `json:"limit"`
	Window string    `json:"window"`
	Oldest time.Time `json:"oldest,omitempty"`
}

// Charge counts one order for host against its registered domain,
// atomically (compare-and-set on the record's revision, retried on
// conflict). Past the limit it counts nothing and fails with a structured
// budget_exhausted error naming the domain and when the next order fits.
func (b *Budget) Charge(ctx context.Context, host string) (Usage, error) {
	domain, err := RegisteredDomain(host)
	if err != nil {
		return Usage{}, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("charging acme budget: %v", err),
			Detail: map[string]string{"host": host}}
	}
	st, err := b.link.Writable(ctx, fmt.Sprintf("charging the acme budget for %s", host))
	if err != nil {
		return Usage{}, err
	}
	key := store.KeySafe(domain)
	for attempt := 0; attempt < 20; attempt++ {
		rec, rev, err := b.load(ctx, st, key)
		if err != nil {
			return Usage{}, err
		}
		now := b.opts.Now()
		rec.prune(now.Add(-b.opts.Window))
		rec.Domain = domain
		u := Usage{Domain: domain, Used: len(rec.Orders), Limit: b.opts.Limit, Window: b.opts.Window.String()}
		if len(rec.Orders) > 0 {
			u.Oldest = rec.Orders[0]
		}
		if len(rec.Orders) >= b.opts.Limit {
			next := now
			if len(rec.Orders) > 0 {
				next = rec.Orders[len(rec.Orders)-b.opts.Limit].Add(b.opts.Window)
			}
			return u, &store.Error{Code: CodeBudgetExhausted,
				Message: fmt.Sprintf("acme order for %s refused: the fleet placed %d orders for %s in the last %s (limit %d)",
					host, len(rec.Orders), domain, b.opts.Window, b.opts.Limit),
				Detail: map[string]string{"host": host, "domain": domain, "used": fmt.Sprint(len(rec.Orders)),
					"limit": fmt.Sprint(b.opts.Limit), "next_allowed": next.UTC().Format(time.RFC3339)}}
		}
		rec.Orders = append(rec.Orders, now)
		rec.Hosts = append(rec.Hosts, host)
		rec.Version = store.RecordVersion
		data, _ := json.Marshal(rec)
		if rev == 0 {
			_, err = st.CreateAcmeBudget(ctx, key, data)
		} else {
			_, err = st.UpdateAcmeBudget(ctx, key, data, rev)
		}
		if err == nil {
			u.Used++
			if u.Oldest.IsZero() {
				u.Oldest = now
			}
			return u, nil
		}
		if !isConflict(err) {
			return Usage{}, store.Classify(fmt.Errorf("charging acme budget for %s: %w", domain, err))
		}
	}
	return Usage{}, &store.Error{Code: store.CodeConflict, Message: fmt.Sprintf("charging acme budget for %s: too much contention", domain),
		Detail: map[string]string{"domain": domain}}
}

// Usage reports a domain's current spend without charging.
func (b *Budget) Usage(ctx context.Context, host string) (Usage, error) {
	domain, err := RegisteredDomain(host)
	if err != nil {
		return Usage{}, err
	}
	st := b.link.Store()
	if st == nil {
		return Usage{}, b.link.Unavailable("reading the acme budget of " + domain)
	}
	rec, _, err := b.load(ctx, st, store.KeySafe(domain))
	if err != nil {
		return Usage{}, err
	}
	rec.prune(b.opts.Now().Add(-b.opts.Window))
	u := Usage{Domain: domain, Used: len(rec.Orders), Limit: b.opts.Limit, Window: b.opts.Window.String()}
	if len(rec.Orders) > 0 {
		u.Oldest = rec.Orders[0]
	}
	return u, nil
}

func (b *Budget) load(ctx context.Context, st *store.Store, key string) (budgetRecord, uint64, error) {
	var rec budgetRecord
	ent, err := st.GetAcmeBudget(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, 0, nil
	}
	if err != nil {
		return rec, 0, store.Classify(fmt.Errorf("reading acme budget %s: %w", key, err))
	}
	if err := json.Unmarshal(ent.Value(), &rec); err != nil {
		return rec, 0, fmt.Errorf("decoding acme budget %s: %w", key, err)
	}
	if rec.Version > store.RecordVersion {
		return rec, 0, fmt.Errorf("acme budget %s: record version %d is newer than this build understands (%d)", key, rec.Version, store.RecordVersion)
	}
	return rec, ent.Revision(), nil
}

func (r *budgetRecord) prune(before time.Time) {
	i := 0
	for i < len(r.Orders) && r.Orders[i].Before(before) {
		i++
	}
	r.Orders = r.Orders[i:]
	if len(r.Hosts) >= i {
		r.Hosts = r.Hosts[i:]
	} else {
		r.Hosts = nil
	}
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || store.IsWrongLastSequence(err)
}

// BudgetIssuer wraps a certmagic.Issuer so that every order it would place
// is first charged to the fleet budget; an order past the budget fails with
// the budget_exhausted error before the CA is contacted. It keeps the inner
// issuer's IssuerKey, so certificates stay where they were.
type BudgetIssuer struct {
	certmagic.Issuer
	Budget *Budget
}

// Issue charges the budget for each registered domain in csr, then issues.
// A refusal is a certmagic.ErrNoRetry wrapping the budget_exhausted
// *store.Error.
func (bi BudgetIssuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	seen := make(map[string]bool)
	for _, name := range csr.DNSNames {
		d, err := RegisteredDomain(name)
		if err != nil || seen[d] {
			continue
		}
		seen[d] = true
		if _, err := bi.Budget.Charge(ctx, name); err != nil {
			if store.HasCode(err, CodeBudgetExhausted) {
				// Retrying inside the window only repeats the refusal
				// (and would hold an on-demand handshake for minutes):
				// tell certmagic to stop. The next handshake or the
				// renewal schedule asks again.
				return nil, certmagic.ErrNoRetry{Err: err}
			}
			return nil, err
		}
	}
	return bi.Issuer.Issue(ctx, csr)
}

// PreCheck forwards to the inner issuer if it has one.
func (bi BudgetIssuer) PreCheck(ctx context.Context, names []string, interactive bool) error {
	if pc, ok := bi.Issuer.(certmagic.PreChecker); ok {
		return pc.PreCheck(ctx, names, interactive)
	}
	return nil
}

// Revoke forwards to the inner issuer if it can revoke.
func (bi BudgetIssuer) Revoke(ctx context.Context, cert certmagic.CertificateResource, reason int) error {
	if r, ok := bi.Issuer.(certmagic.Revoker); ok {
		return r.Revoke(ctx, cert, reason)
	}
	return fmt.Errorf("issuer %s cannot revoke", bi.IssuerKey())
}

// Interface guards.
var (
	_ certmagic.Issuer     = BudgetIssuer{}
	_ certmagic.PreChecker = BudgetIssuer{}
	_ certmagic.Revoker    = BudgetIssuer{}
)
