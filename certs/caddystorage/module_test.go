package caddystorage_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

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
	if v, err := srv.Store.Certs.Get(ctx, "certificates.iss.a=example=com.a=example=com=crt"); err != nil || string(v.Value()) != "pem" {
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
	// Nothing listens here: a clear unavailable error, not a hang.
	s = caddystorage.Storage{Config: store.Config{NATSURL: "nats://127.0.0.1:1"}}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CertMagicStorage(); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("unreachable NATS: %v", err)
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
