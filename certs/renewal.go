package certs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// RenewalItem is one unit of renewal work: a scheduled message in the
// renewals stream that one gateway takes, works under the host's lock and
// acknowledges.
type RenewalItem struct {
	Version int    `json:"version"`
	Host    string `json:"host"`
	// Force renews even if certmagic thinks the certificate is fresh
	// (operator request, tests).
	Force bool `json:"force,omitempty"`
	// Attempt counts the failed attempts before this one.
	Attempt int `json:"attempt,omitempty"`
	// Reason says why the item exists: "scheduled", "retry" or "manual".
	Reason string `json:"reason,omitempty"`
}

// Status is the durable record of a certificate's last renewal outcome, one
// per host in the certificate status bucket. It is written only by the
// gateway that attempted the work.
type Status struct {
	Version       int       `json:"version"`
	Host          string    `json:"host"`
	Issuer        string    `json:"issuer,omitempty"`
	Expiry        time.Time `json:"expiry,omitzero"`
	LastAttempt   time.Time `json:"last_attempt,omitzero"`
	LastSuccess   time.Time `json:"last_success,omitzero"`
	LastError     string    `json:"last_error,omitempty"`
	LastErrorCode string    `json:"last_error_code,omitempty"`
	NextAttempt   time.Time `json:"next_attempt,omitzero"`
	// Failures counts consecutive failed attempts; 0 after a success.
	Failures int    `json:"failures,omitempty"`
	Gateway  string `json:"gateway,omitempty"`
}

// ScheduleRenewal places item in the renewals stream to be worked at at. A
// host has one pending schedule: a new one replaces the previous.
func ScheduleRenewal(ctx context.Context, s *store.Store, item RenewalItem, at time.Time) error {
	h, err := NormalizeHost(item.Host)
	if err != nil {
		return &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("scheduling renewal: %v", err), Detail: map[string]string{"host": item.Host}}
	}
	item.Host = h
	item.Version = store.RecordVersion
	if item.Reason == "" {
		item.Reason = "scheduled"
	}
	data, _ := json.Marshal(item)
	if !at.After(time.Now()) {
		// Due now: place the work item itself. A schedule's "@at" has
		// one-second resolution, so a time already past would depend on
		// how the server treats a schedule that is overdue on arrival.
		if _, err := s.JS.Publish(ctx, s.Names.CertRenewalSubject(h), data); err != nil {
			return store.Classify(fmt.Errorf("placing renewal of %s: %w", h, err))
		}
		return nil
	}
	_, err = s.JS.Publish(ctx, s.Names.CertRenewalScheduleSubject(h), data,
		jetstream.WithScheduleAt(at),
		jetstream.WithScheduleTarget(s.Names.CertRenewalSubject(h)),
		// Generated work items expire eventually; a month outlives any
		// outage in which no gateway could take them.
		jetstream.WithScheduleTTL(30*24*time.Hour))
	if err != nil {
		return store.Classify(fmt.Errorf("scheduling renewal of %s at %s: %w", h, at.UTC().Format(time.RFC3339), err))
	}
	return nil
}

// RenewResult describes the certificate a successful renewal left in
// storage.
type RenewResult struct {
	Issuer    string
	NotBefore time.Time
	Expiry    time.Time
}

// RenewFunc renews item.Host under its lock and reports the result.
type RenewFunc func(ctx context.Context, item RenewalItem) (RenewResult, error)

// CertmagicRenew renews through cfg (which takes the host's issue lock in
// its Storage, our Storage) and reads back the certificate now in storage.
// The renewed certificate also replaces the one in cfg's cache.
func CertmagicRenew(cfg *certmagic.Config) RenewFunc {
	return func(ctx context.Context, item RenewalItem) (RenewResult, error) {
		if err := cfg.RenewCertSync(ctx, item.Host, item.Force); err != nil {
			return RenewResult{}, err
		}
		cert, err := cfg.CacheManagedCertificate(ctx, item.Host)
		if err != nil {
			return RenewResult{}, fmt.Errorf("loading renewed certificate for %s: %w", item.Host, err)
		}
		res := RenewResult{NotBefore: cert.Leaf.NotBefore, Expiry: cert.Leaf.NotAfter}
		for _, iss := range cfg.Issuers {
			if cfg.Storage.Exists(ctx, certmagic.StorageKeys.SiteCert(iss.IssuerKey(), item.Host)) {
				res.Issuer = iss.IssuerKey()
				break
			}
		}
		return res, nil
	}
}

// RenewerConfig configures a Renewer.
type RenewerConfig struct {
	// Link is the store the renewal items, schedules and status records
	// live in. The worker waits for it while it is unreachable.
	Link  *store.Link
	Renew RenewFunc
	// Name is this gateway, recorded in status records.
	Name   string
	Logger *zap.Logger
	// Backoff is the wait before retry number attempt (1-based); default
	// 1m doubling up to 6h.
	Backoff func(attempt int) time.Duration
	// NextRenewal is when a fresh certificate is due again; default when a
	// third of its lifetime remains (certmagic's default window).
	NextRenewal func(RenewResult) time.Time
	// Durable names the consumer all gateways share; default
	// store.RenewalsConsumer, which the control plane provisions (an
	// untrusted gateway may not create one). A Renewer with control
	// credentials creates a consumer of another name with AckWait.
	Durable string
	// AckWait, for a consumer this Renewer creates, bounds one renewal
	// attempt without progress. The worker signals progress every third of
	// its consumer's AckWait while it runs. Default 2m.
	AckWait time.Duration
	// MinInterval is the shortest wait before the next scheduled renewal
	// of a certificate that was just renewed (or found fresh): a renewal
	// that leaves a certificate already inside its renewal window must not
	// come straight back in a loop. Default 10m.
	MinInterval time.Duration
}

// Renewer works renewal items: whichever gateway's Renewer takes an item
// renews it and records the outcome.
type Renewer struct {
	cfg RenewerConfig
	log *zap.Logger

	mu       sync.Mutex
	inflight map[string]int // hosts this Renewer is renewing right now
}

// NewRenewer validates cfg and fills defaults.
func NewRenewer(cfg RenewerConfig) (*Renewer, error) {
	if cfg.Link == nil {
		return nil, fmt.Errorf("creating renewer: no store link")
	}
	if cfg.Renew == nil {
		return nil, fmt.Errorf("creating renewer: no renew function")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Backoff == nil {
		cfg.Backoff = func(attempt int) time.Duration {
			d := time.Minute << min(max(attempt-1, 0), 9)
			return min(d, 6*time.Hour)
		}
	}
	if cfg.NextRenewal == nil {
		cfg.NextRenewal = func(r RenewResult) time.Time {
			return r.Expiry.Add(-r.Expiry.Sub(r.NotBefore) / 3)
		}
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = store.RenewalsAckWait
	}
	if cfg.Durable == "" {
		cfg.Durable = store.RenewalsConsumer
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 10 * time.Minute
	}
	return &Renewer{cfg: cfg, log: cfg.Logger, inflight: make(map[string]int)}, nil
}

// Run takes renewal items until ctx ends. Each item is worked by exactly one
// Renewer in the fleet (one shared durable consumer); an item whose worker
// dies is redelivered after AckWait. While the store is unreachable it
// waits for it: renewal is work for a gateway that can reach the fleet.
func (r *Renewer) Run(ctx context.Context) error {
	st, err := r.cfg.Link.Wait(ctx)
	if err != nil {
		return nil // ctx ended
	}
	cons, err := st.RenewalConsumer(ctx, r.cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) && r.cfg.Durable != store.RenewalsConsumer {
		cfg := store.RenewalsConsumerConfig(st.Names)
		cfg.Durable, cfg.AckWait = r.cfg.Durable, r.cfg.AckWait
		cons, err = st.CreateRenewalConsumer(ctx, cfg)
	}
	if err != nil {
		return store.Classify(fmt.Errorf("binding renewal consumer %s (does `control server` provision it?): %w", r.cfg.Durable, err))
	}
	progress := cons.CachedInfo().Config.AckWait / 3
	var wg sync.WaitGroup
	defer wg.Wait()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		wg.Add(1)
		defer wg.Done()
		r.work(ctx, m, progress)
	}, jetstream.PullMaxMessages(4))
	if err != nil {
		return store.Classify(fmt.Errorf("consuming renewals: %w", err))
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	return nil
}

func (r *Renewer) work(ctx context.Context, m jetstream.Msg, progress time.Duration) {
	var item RenewalItem
	if err := json.Unmarshal(m.Data(), &item); err != nil || item.Host == "" || item.Version > store.RecordVersion {
		r.log.Error("dropping malformed renewal item", zap.String("subject", m.Subject()), zap.ByteString("data", m.Data()), zap.Error(err))
		_ = m.TermWithReason("malformed renewal item")
		return
	}
	// Tell the server we are alive while the renewal runs.
	done := make(chan struct{})
	var hb sync.WaitGroup
	hb.Add(1)
	go func() {
		defer hb.Done()
		t := time.NewTicker(progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	host := normalizeOrLower(item.Host)
	r.setInflight(host, 1)
	res, err := r.cfg.Renew(ctx, item)
	r.setInflight(host, -1)
	close(done)
	hb.Wait()
	if ctx.Err() != nil {
		// Shutting down mid-renewal: let another gateway take it now.
		_ = m.Nak()
		return
	}
	if rerr := r.Record(ctx, item, res, err); rerr != nil {
		r.log.Error("recording renewal outcome", zap.String("host", item.Host), zap.Error(rerr))
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

// Record writes the outcome of an attempt on item as host's status and
// schedules the next item: the next renewal after a success, a retry with
// backoff after a failure. Callers outside Run (an obtain hook) use it too.
func (r *Renewer) Record(ctx context.Context, item RenewalItem, res RenewResult, renewErr error) error {
	host, err := NormalizeHost(item.Host)
	if err != nil {
		return err
	}
	st, err := r.cfg.Link.Writable(ctx, "recording the renewal of "+host)
	if err != nil {
		return err
	}
	prev, _, err := getStatus(ctx, st, host)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		return err
	}
	return r.record(ctx, st, host, item, res, renewErr, prev)
}

// record is Record for a normalized host whose stored status is prev.
func (r *Renewer) record(ctx context.Context, st *store.Store, host string, item RenewalItem, res RenewResult, renewErr error, prev Status) error {
	now := time.Now()
	s := prev
	s.Version, s.Host, s.Gateway, s.LastAttempt = store.RecordVersion, host, r.cfg.Name, now
	next := RenewalItem{Host: host, Force: item.Force}
	if renewErr == nil {
		s.Issuer, s.Expiry, s.LastSuccess = res.Issuer, res.Expiry, now
		s.LastError, s.LastErrorCode, s.Failures = "", "", 0
		s.NextAttempt = r.cfg.NextRenewal(res)
		if floor := now.Add(r.cfg.MinInterval); s.NextAttempt.Before(floor) {
			s.NextAttempt = floor
		}
		next.Force, next.Reason = false, "scheduled"
	} else {
		s.LastError = renewErr.Error()
		s.LastErrorCode = errorCode(renewErr)
		s.Failures = item.Attempt + 1
		s.NextAttempt = now.Add(r.cfg.Backoff(s.Failures))
		next.Attempt, next.Reason = s.Failures, "retry"
	}
	if err := putStatus(ctx, st, s); err != nil {
		return err
	}
	if err := ScheduleRenewal(ctx, st, next, s.NextAttempt); err != nil {
		return err
	}
	if renewErr != nil {
		r.log.Warn("certificate renewal failed", zap.String("host", host), zap.Int("failures", s.Failures),
			zap.Time("next_attempt", s.NextAttempt), zap.Error(renewErr))
	} else {
		r.log.Info("certificate renewed", zap.String("host", host), zap.Time("expiry", s.Expiry), zap.Time("next_renewal", s.NextAttempt))
	}
	return nil
}

// HandleEvent is a certmagic OnEvent hook (Caddy passes the same names and
// data through its events app) that makes work done outside the renewal
// items visible:
//
//   - cert_obtained (first issuance, certmagic's own maintenance renewal)
//     records the certificate and schedules its renewal; storage reads the
//     certificate back to learn its lifetime;
//   - cert_failed of a renewal records the error and schedules a retry;
//   - cert_failed of a first issuance records the error only: there is no
//     certificate to renew yet, and the next handshake asks again.
//
// Events about a host this Renewer is renewing right now are skipped: the
// renewal records its own outcome once.
func (r *Renewer) HandleEvent(ctx context.Context, storage certmagic.Storage, event string, data map[string]any) error {
	if event != "cert_obtained" && event != "cert_failed" {
		return nil
	}
	host, _ := data["identifier"].(string)
	if host == "" {
		return nil
	}
	if r.isInflight(normalizeOrLower(host)) {
		return nil
	}
	if event == "cert_failed" {
		failure, _ := data["error"].(error)
		if failure == nil {
			failure = fmt.Errorf("certificate for %s failed without an error", host)
		}
		renewal, _ := data["renewal"].(bool)
		return r.recordFailure(ctx, host, failure, renewal)
	}
	issuer, _ := data["issuer"].(string)
	path, _ := data["certificate_path"].(string)
	if path == "" {
		return nil
	}
	pemBytes, err := storage.Load(ctx, path)
	if err != nil {
		return fmt.Errorf("recording obtained certificate for %s: %w", host, err)
	}
	leaf, err := parseLeaf(pemBytes)
	if err != nil {
		return fmt.Errorf("recording obtained certificate for %s: %w", host, err)
	}
	return r.Record(ctx, RenewalItem{Host: host}, RenewResult{Issuer: issuer, NotBefore: leaf.NotBefore, Expiry: leaf.NotAfter}, nil)
}

// recordFailure records a failure reported by an event: a failed renewal
// counts on from the stored failures and is retried; a failed first
// issuance is only recorded.
func (r *Renewer) recordFailure(ctx context.Context, host string, failure error, renewal bool) error {
	h, err := NormalizeHost(host)
	if err != nil {
		return err
	}
	st, err := r.cfg.Link.Writable(ctx, "recording the failure of "+h)
	if err != nil {
		return err
	}
	prev, _, err := getStatus(ctx, st, h)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		return err
	}
	if renewal {
		return r.record(ctx, st, h, RenewalItem{Host: h, Attempt: prev.Failures, Reason: "retry"}, RenewResult{}, failure, prev)
	}
	s := prev
	s.Version, s.Host, s.Gateway, s.LastAttempt = store.RecordVersion, h, r.cfg.Name, time.Now()
	s.LastError, s.LastErrorCode = failure.Error(), errorCode(failure)
	s.Failures = prev.Failures + 1
	s.NextAttempt = time.Time{}
	if err := putStatus(ctx, st, s); err != nil {
		return err
	}
	r.log.Warn("certificate issuance failed", zap.String("host", h), zap.Int("failures", s.Failures), zap.Error(failure))
	return nil
}

func errorCode(err error) string {
	var se *store.Error
	if errors.As(err, &se) {
		return se.Code
	}
	return ""
}

func (r *Renewer) setInflight(host string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[host] += delta; r.inflight[host] <= 0 {
		delete(r.inflight, host)
	}
}

func (r *Renewer) isInflight(host string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight[host] > 0
}

func statusKey(host string) string { return store.KeySafe(host) }

func getStatus(ctx context.Context, st *store.Store, host string) (Status, uint64, error) {
	var s Status
	ent, err := st.GetCertStatus(ctx, statusKey(host))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s, 0, &store.Error{Code: store.CodeNotFound, Message: fmt.Sprintf("no certificate status for %s", host), Detail: map[string]string{"host": host}}
	}
	if err != nil {
		return s, 0, store.Classify(fmt.Errorf("reading certificate status of %s: %w", host, err))
	}
	if err := decodeStatus(ent.Value(), &s); err != nil {
		return s, 0, err
	}
	return s, ent.Revision(), nil
}

func decodeStatus(data []byte, s *Status) error {
	if err := json.Unmarshal(data, s); err != nil {
		return fmt.Errorf("decoding certificate status: %w", err)
	}
	if s.Version > store.RecordVersion {
		return fmt.Errorf("certificate status of %s: record version %d is newer than this build understands (%d)", s.Host, s.Version, store.RecordVersion)
	}
	return nil
}

func putStatus(ctx context.Context, st *store.Store, s Status) error {
	data, _ := json.Marshal(s)
	if _, err := st.PutCertStatus(ctx, statusKey(s.Host), data); err != nil {
		return store.Classify(fmt.Errorf("writing certificate status of %s: %w", s.Host, err))
	}
	return nil
}

// ListStatus returns every certificate's status record, sorted by host, for
// `control certs`. A record that cannot be decoded, or that names another
// host than its key, is skipped.
func ListStatus(ctx context.Context, st *store.Store) ([]Status, error) {
	entries, err := st.ScanCertStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing certificate status: %w", err)
	}
	out := make([]Status, 0, len(entries))
	for _, e := range entries {
		var s Status
		if err := decodeStatus(e.Value, &s); err != nil || statusKey(s.Host) != e.Key {
			store.SkippedRecords.Add(1)
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}
