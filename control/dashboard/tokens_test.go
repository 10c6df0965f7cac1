package dashboard

import (
	"context"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A dashboard token is shown once and stored hashed: the stored record
// holds no secret; the token checks, a wrong secret or ID does not (with
// the same answer), and a revoked token stops checking.
func TestDashboardTokens(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	tok, rec, err := NewToken("ops")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutDashboardToken(ctx, rec); err != nil {
		t.Fatal(err)
	}
	_, secret, err := ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := storetest.Bucket(t, s, s.Names.DashboardTokensBucket()).Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(ent.Value()), secret) {
		t.Fatal("the stored record holds the secret")
	}
	if got, err := CheckToken(ctx, s, tok); err != nil || got.Name != "ops" {
		t.Fatalf("checking the token: %+v %v", got, err)
	}
	other, _, _ := NewToken("x")
	otherID, _, _ := ParseToken(other)
	for what, bad := range map[string]string{
		"a wrong secret": tok[:len(tok)-2] + "xx",
		"an unknown ID":  strings.Replace(tok, rec.ID, otherID, 1),
		"garbage":        "<script>alert(1)</script>",
		"empty":          "",
	} {
		if _, err := CheckToken(ctx, s, bad); !store.HasCode(err, store.CodeUnauthorized) {
			t.Errorf("%s: want unauthorized, got %v", what, err)
		}
	}
	list, err := s.ListDashboardTokens(ctx)
	if err != nil || len(list) != 1 || list[0].ID != rec.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.DeleteDashboardToken(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckToken(ctx, s, tok); !store.HasCode(err, store.CodeUnauthorized) {
		t.Fatalf("a revoked token: %v", err)
	}
	if err := s.DeleteDashboardToken(ctx, rec.ID); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("revoking twice: %v", err)
	}
}
