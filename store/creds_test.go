package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// userCreds is a credentials file of a new user key with role's tag,
// signed by a new account key.
func userCreds(t *testing.T, role string) ([]byte, string) {
	t.Helper()
	account, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Tags.Add("role:" + role)
	tok, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	b, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	return b, pub
}

// A box reconnecting reads its credentials file again (a renewal may have
// replaced it) but decodes the JWT only when the file changed.
func TestHeldCredsDecodedOnlyWhenTheFileChanges(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.creds")
	first, firstPub := userCreds(t, "agent")
	if err := os.WriteFile(file, first, 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := readCreds(file)
	if err != nil || held.pub != firstPub || held.role != "agent" {
		t.Fatalf("read %+v, %v", held, err)
	}
	again, err := held.reread(file)
	if err != nil || again != held {
		t.Fatalf("an unchanged file was decoded again: %p, want %p (%v)", again, held, err)
	}
	second, secondPub := userCreds(t, "agent")
	if err := os.WriteFile(file, second, 0o600); err != nil {
		t.Fatal(err)
	}
	renewed, err := held.reread(file)
	if err != nil || renewed == held || renewed.pub != secondPub {
		t.Fatalf("a replaced file read as %+v, %v; want the key %s", renewed, err, secondPub)
	}
	if err := os.WriteFile(file, []byte("not credentials"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := held.reread(file); err == nil {
		t.Fatal("a damaged file was taken")
	}
}
