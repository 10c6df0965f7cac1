package store_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Port claims live in the hosts bucket beside host claims without either
// kind's reader taking the other's records; a claim filed under another
// port than its body names is not taken.
func TestPortClaims(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	pg := store.PortKey{Proto: store.ProtoTCP, Port: 5432}
	dns := store.PortKey{Proto: store.ProtoUDP, Port: 53}
	for _, c := range []*store.PortClaim{
		{Proto: pg.Proto, Port: pg.Port, Namespace: "prod", Service: "db", At: time.Now().UTC()},
		{Proto: dns.Proto, Port: dns.Port, Namespace: "infra", Service: "dns", At: time.Now().UTC()},
	} {
		if err := s.PutPortClaim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutHostClaim(ctx, &store.HostClaim{Host: "api.example.com", Namespace: "prod", Since: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	// A forged record: udp/5353's key, tcp/22's body.
	forged, _ := json.Marshal(store.PortClaim{Version: store.RecordVersion, Proto: "tcp", Port: 22, Namespace: "evil"})
	if _, err := storetest.Bucket(t, s, s.Names.HostsBucket()).Put(ctx, store.PortClaimKey(store.PortKey{Proto: "udp", Port: 5353}), forged); err != nil {
		t.Fatal(err)
	}
	got, err := s.PortClaims(ctx, []store.PortKey{pg, dns, {Proto: "tcp", Port: 1}, {Proto: "udp", Port: 5353}})
	if err != nil || len(got) != 2 || got[pg].Namespace != "prod" || got[pg].Service != "db" || got[dns].Namespace != "infra" {
		t.Fatalf("PortClaims = %+v, %v", got, err)
	}
	if one, err := s.PortClaims(ctx, []store.PortKey{dns}); err != nil || len(one) != 1 || one[dns].Service != "dns" {
		t.Fatalf("one port: %+v, %v", one, err)
	}
	var listed []string
	if err := s.ListPortClaims(ctx, func(c *store.PortClaim) error { listed = append(listed, c.Key().String()+"="+c.Namespace); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 || listed[0] != "tcp/5432=prod" || listed[1] != "udp/53=infra" {
		t.Fatalf("listed ports %v", listed)
	}
	// The host claims' list sees hosts only, and skips nothing for the
	// ports beside them.
	skipped := store.SkippedRecords.Load()
	var hostsListed []string
	if err := s.ListHostClaims(ctx, func(c *store.HostClaim) error { hostsListed = append(hostsListed, c.Host); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(hostsListed) != 1 || hostsListed[0] != "api.example.com" || store.SkippedRecords.Load() != skipped {
		t.Fatalf("host claims %v, %d skipped", hostsListed, store.SkippedRecords.Load()-skipped)
	}
	if err := s.DeletePortClaim(ctx, pg); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePortClaim(ctx, pg); err != nil {
		t.Fatalf("deleting a claim already gone: %v", err)
	}
	if got, err := s.PortClaims(ctx, []store.PortKey{pg, dns}); err != nil || len(got) != 1 {
		t.Fatalf("after release: %+v, %v", got, err)
	}
}

// Every port's key sorts under the port prefix and parses back.
func TestPortClaimKey(t *testing.T) {
	for k, want := range map[store.PortKey]string{{Proto: "tcp", Port: 5432}: "=port.tcp.5432", {Proto: "udp", Port: 53}: "=port.udp.53"} {
		if got := store.PortClaimKey(k); got != want {
			t.Errorf("PortClaimKey(%s) = %q, want %q", k, got, want)
		}
		c := store.PortClaim{Proto: k.Proto, Port: k.Port}
		if err := c.KeyOK(want); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}
