package invites_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestInviteSingleUsePerMachine(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, srv.Store, invites.Spec{Region: "eu", Labels: map[string]string{"tier": "edge"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := invites.Redeem(ctx, srv.Store, tok, "m1", store.InviteUseAdmit)
	if err != nil || inv.Region != "eu" || inv.Labels["tier"] != "edge" {
		t.Fatalf("redeem: %+v %v", inv, err)
	}
	if _, err := invites.Redeem(ctx, srv.Store, tok, "m1", store.InviteUseMesh); err != nil {
		t.Fatalf("same machine again (agent then meshd): %v", err)
	}
	// Each use once: a second admission or registration with the same
	// invite is refused, whoever asks.
	for _, use := range []string{store.InviteUseAdmit, store.InviteUseMesh} {
		if _, err := invites.Redeem(ctx, srv.Store, tok, "m1", use); !store.HasCode(err, store.CodeConflict) {
			t.Fatalf("a second %s by the same machine: got %v, want conflict", use, err)
		}
	}
	if _, err := invites.Redeem(ctx, srv.Store, tok, "m2", store.InviteUseEnroll); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("other machine: got %v, want conflict", err)
	}
	if _, err := invites.Redeem(ctx, srv.Store, "garbage", "m3", store.InviteUseAdmit); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("garbage token: %v", err)
	}
	if _, err := invites.Redeem(ctx, srv.Store, store.InviteTokenPrefix+"unknown", "m3", store.InviteUseAdmit); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
}

func TestInviteRacingMachinesOneWins(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, srv.Store, invites.Spec{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	winners := 0
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		st := srv.Connect(t)
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if _, err := invites.Redeem(ctx, st, tok, id, store.InviteUseEnroll); err == nil {
				mu.Lock()
				winners++
				mu.Unlock()
			}
		}(string(rune('a' + i)))
	}
	wg.Wait()
	if winners != 1 {
		t.Fatalf("%d machines redeemed one invite", winners)
	}
}

func TestInviteExpired(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, srv.Store, invites.Spec{TTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 2*time.Second, "invite expiry", func() bool {
		_, err = invites.Redeem(ctx, srv.Store, tok, "late", store.InviteUseAdmit)
		return err != nil
	})
	if !store.HasCode(err, store.CodeInvalid) && !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("expired invite: %v", err)
	}
}

// A token naming the fleet's CAs is redeemed by its secret alone; the CA
// part round-trips and a mangled one is refused.
func TestInviteCarriesCAFingerprints(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, srv.Store, invites.Spec{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fps := []string{strings.Repeat("ab", 32), strings.Repeat("01", 32)}
	withCAs := invites.WithCAs(tok, fps)
	got, err := invites.CAs(withCAs)
	if err != nil || len(got) != 2 || got[0] != fps[0] || got[1] != fps[1] {
		t.Fatalf("fingerprints %v %v", got, err)
	}
	if cas, err := invites.CAs(tok); err != nil || cas != nil {
		t.Fatalf("a token without CAs: %v %v", cas, err)
	}
	if _, err := invites.CAs(tok + ".nope"); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("a mangled CA part: %v", err)
	}
	if _, err := invites.Redeem(ctx, srv.Store, withCAs, "m1", store.InviteUseEnroll); err != nil {
		t.Fatalf("redeeming the token with its CAs: %v", err)
	}
	if _, err := invites.Redeem(ctx, srv.Store, tok, "m1", store.InviteUseAdmit); err != nil {
		t.Fatalf("the same secret without them, same machine: %v", err)
	}
}

// A token names the fleet's CAs and, for `control join`, the storage
// nodes' URLs; neither changes the secret it is stored under.
func TestTokenNamesCAsAndStore(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	tok := invites.WithStore(invites.WithCAs(store.InviteTokenPrefix+"c2VjcmV0", []string{fp}), []string{"tls://10.0.0.1:4222", "tls://10.0.0.2:4222"})
	if cas, err := invites.CAs(tok); err != nil || len(cas) != 1 || cas[0] != fp {
		t.Fatalf("CAs %v (%v) of %s", cas, err, tok)
	}
	if urls, err := invites.StoreURLs(tok); err != nil || urls != "tls://10.0.0.1:4222,tls://10.0.0.2:4222" {
		t.Fatalf("StoreURLs %q (%v)", urls, err)
	}
	plain := invites.WithCAs(store.InviteTokenPrefix+"c2VjcmV0", []string{fp})
	if urls, err := invites.StoreURLs(plain); err != nil || urls != "" {
		t.Fatalf("a token naming no store: %q (%v)", urls, err)
	}
	// No CAs, no store: a box could not check the nodes it would be sent to.
	if got := invites.WithStore(store.InviteTokenPrefix+"c2VjcmV0", []string{"tls://x:4222"}); got != store.InviteTokenPrefix+"c2VjcmV0" {
		t.Fatalf("store named without CAs: %s", got)
	}
	if _, err := invites.StoreURLs(tok + "!"); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("an unreadable store part: %v", err)
	}
	// Redeemed under its secret alone.
	srv := storetest.Start(t)
	ctx := context.Background()
	raw, _, err := invites.Create(ctx, srv.Store, invites.Spec{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	full := invites.WithStore(invites.WithCAs(raw, []string{fp}), []string{"tls://10.0.0.1:4222"})
	if _, err := invites.Redeem(ctx, srv.Store, full, "m1", store.InviteUseEnroll); err != nil {
		t.Fatalf("redeeming a token that names the store: %v", err)
	}
}

// An invite's region is named as every region is (one lower-case DNS
// label): anything else is refused before an invite is stored.
func TestInviteRegionMustBeARegionName(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	for _, bad := range []string{"EU", "eu west", "eu.west", "-eu"} {
		_, _, err := invites.Create(ctx, srv.Store, invites.Spec{Region: bad, TTL: time.Minute})
		if se := store.AsError(err); se == nil || se.Code != store.CodeInvalid || se.Detail["region"] != bad || !strings.Contains(se.Message, "DNS label") {
			t.Errorf("region %q: %v", bad, err)
		}
	}
	keys, err := storetest.Bucket(t, srv.Store, srv.Store.Names.InvitesBucket()).ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		t.Errorf("invite %s stored by a refused create", k)
	}
}
