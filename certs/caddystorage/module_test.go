package caddystorage_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/certs/caddystorage"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestModuleStoresInNATS(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	raw, _ := json.Marshal(map[string]any{"nats_url": srv.URL, "lock_ttl": "5s"})
	var s caddystorage.Storage
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	cm, err := s.CertMagicStorage()
	if err != nil {
		t.Fatal(err)
	}
	if err := cm.Store(ctx, "certificates/iss/a.example.com/a.example.com.crt", []byte("pem")); err != nil {
		t.Fatal(err)
	}
	if v, err := storetest.Bucket(t, srv.Store, srv.Store.Names.CertsBucket()).Get(ctx, "certificates.iss.a=example=com.a=example=com=crt"); err != nil || string(v.Value()) != "pem" {
		t.Fatalf("value not in the certs bucket: %v", err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
}

func TestModuleBadConfig(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	s := caddystorage.Storage{Config: store.Config{Authority: "bad.authority"}}
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "authority") {
		t.Fatalf("bad authority: %v", err)
	}
	s = caddystorage.Storage{LockTTL: caddy.Duration(1)}
	if err := s.Validate(); err == nil {
		t.Fatal("lock_ttl 1ns accepted")
	}
}

// With nothing listening the storage still provisions (a config must not
// fail to load because the store is away); writes are refused at once with
// store_unavailable, and the metrics say so.
func TestModuleProvisionsWithoutTheStore(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	s := caddystorage.Storage{Config: store.Config{NATSURL: "nats://127.0.0.1:1"}, LocalDir: t.TempDir()}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	cm, err := s.CertMagicStorage()
	if err != nil {
		t.Fatalf("unreachable NATS made the storage fail: %v", err)
	}
	defer s.Cleanup()
	start := time.Now()
	if err := cm.Store(ctx, "certificates/iss/a.example.com/a.example.com.crt", []byte("pem")); !store.HasCode(err, store.CodeStoreUnavailable) {
		t.Fatalf("store while unreachable: %v", err)
	}
	if err := cm.Lock(ctx, "issue_cert_a.example.com"); !store.HasCode(err, store.CodeStoreUnavailable) {
		t.Fatalf("lock while unreachable: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refusals took %s", took)
	}
	mfs, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				got[mf.GetName()] = g.GetValue()
			}
			if c := m.GetCounter(); c != nil {
				got[mf.GetName()] = c.GetValue()
			}
		}
	}
	if v, ok := got["edgeplane_certstore_connected"]; !ok || v != 0 || got["edgeplane_certstore_refused_total"] != 2 {
		t.Fatalf("metrics %v; want connected 0 and 2 refusals", got)
	}
}

// The former spellings nats and creds still configure the storage, as
// nats_url and creds_file; given beside a different new value they are
// refused rather than one silently winning.
func TestModuleFormerSpelling(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	var s caddystorage.Storage
	if err := json.Unmarshal([]byte(`{"nats": "nats://10.0.0.1:4222", "creds": "/etc/gw.creds"}`), &s); err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if s.NATSURL != "nats://10.0.0.1:4222" || s.CredsFile != "/etc/gw.creds" || s.NATS != "" || s.Creds != "" {
		t.Fatalf("former spelling not read as the new one: %+v", s)
	}
	s = caddystorage.Storage{NATS: "nats://10.0.0.1:4222", Config: store.Config{NATSURL: "nats://10.0.0.2:4222"}}
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "disagree") {
		t.Fatalf("nats and nats_url disagreeing: %v", err)
	}
}
