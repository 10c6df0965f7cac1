package caddystorage_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/certs/caddystorage"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestModuleStoresInNATS(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	raw, _ := json.Marshal(map[string]any{"nats": srv.URL, "lock_ttl": "5s"})
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
	s := caddystorage.Storage{Authority: "bad.authority"}
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "authority") {
		t.Fatalf("bad authority: %v", err)
	}
	s = caddystorage.Storage{LockTTL: caddy.Duration(1)}
	if err := s.Validate(); err == nil {
		t.Fatal("lock_ttl 1ns accepted")
	}
	// Nothing listens here: a clear unavailable error, not a hang.
	s = caddystorage.Storage{NATS: "nats://127.0.0.1:1"}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CertMagicStorage(); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("unreachable NATS: %v", err)
	}
}
