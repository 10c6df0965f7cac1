package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A revocation of credentials that expired since is left out of what
// storage nodes apply: they refuse expired credentials anyway, and a fleet
// renewing its credentials revokes a key per box and role at each renewal.
func TestExpiredRevocationsAreLeftOut(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	user := func() string {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		return pub
	}
	live, gone, never := user(), user(), user()
	for _, r := range []*store.Revocation{
		{User: live, Expires: time.Now().Add(time.Hour)},
		{User: gone, Expires: time.Now().Add(-time.Second)},
		{User: never},
	} {
		if err := srv.Store.RevokeUser(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var applied map[string]time.Time
	stop, err := store.WatchRevocations(ctx, srv.Store, func(revoked map[string]time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		applied = map[string]time.Time{}
		for k, v := range revoked {
			applied[k] = v
		}
		return nil
	}, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mu.Lock()
	defer mu.Unlock()
	if _, ok := applied[gone]; ok || len(applied) != 2 {
		t.Fatalf("applied %v: want %s and %s, not the expired %s", applied, live, never, gone)
	}
}
