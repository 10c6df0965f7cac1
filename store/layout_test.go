package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Every provisioned bucket refuses a rollup (which would wipe it through
// one key's write permission) and a purge; every stream and bucket has a
// size limit and a largest message.
func TestLayoutRefusesRollupsAndHasLimits(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	s := srv.Store
	sMachines := store.BucketOf(s, s.Names.MachinesBucket())
	if _, err := store.PutJSON(ctx, sMachines, "m1", &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive}); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$KV." + s.Names.MachinesBucket() + ".evil")
	m.Header.Set("Nats-Rollup", "all")
	m.Data = []byte("{}")
	if _, err := s.JS.PublishMsg(ctx, m); err == nil || !strings.Contains(err.Error(), "rollup not permitted") {
		t.Fatalf("rollup into the machines bucket: %v", err)
	}
	if _, err := sMachines.Get(ctx, "m1"); err != nil {
		t.Fatalf("the machine record is gone: %v", err)
	}
	for _, name := range s.StreamNames() {
		str, err := s.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := str.CachedInfo().Config
		if cfg.MaxBytes <= 0 || cfg.MaxMsgSize <= 0 {
			t.Errorf("%s has no size limit (max bytes %d, max message %d)", name, cfg.MaxBytes, cfg.MaxMsgSize)
		}
		if strings.HasPrefix(name, "KV_") && (cfg.AllowRollup || !cfg.DenyPurge || !cfg.DenyDelete) {
			t.Errorf("%s allows rollups or purges: %+v", name, cfg)
		}
		if err := str.Purge(ctx); err == nil && name != s.Names.CertRenewalsStream() {
			t.Errorf("%s was purged", name)
		}
	}
}

// Heartbeats are not republished (gateways follow the liveness judgement):
// a store provisioned by an earlier release, which republished them,
// stops at the next provisioning, and a beat then reaches no subscriber.
func TestHeartbeatsAreNotRepublished(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	s := srv.Store
	name := "KV_" + s.Names.MachineBeatsBucket()
	str, err := s.JS.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := str.CachedInfo().Config
	old := "rp.kv." + s.Names.MachineBeatsBucket() + ".>"
	cfg.RePublish = &jetstream.RePublish{Source: "$KV." + s.Names.MachineBeatsBucket() + ".>", Destination: old}
	if _, err := s.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s = srv.Connect(t) // provisions again, as a control server of this release starting
	info, err := s.StreamInfo(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.RePublish != nil {
		t.Fatalf("%s still republishes: %+v", name, info.Config.RePublish)
	}
	sub, err := s.NC.SubscribeSync(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a beat was republished on %s", m.Subject)
	}
}
