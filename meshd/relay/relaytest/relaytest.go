// Package relaytest runs a real mesh relay on loopback and allocates on it,
// for tests of the relay and of what carries WireGuard through it.
package relaytest

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/relay"
)

// Start runs a relay on 127.0.0.1 checking credentials against secret,
// closed when the test ends. It logs nowhere: pion's goroutines log after
// Close returns, which a test's logger does not survive.
func Start(t testing.TB, secret []byte) *relay.Server {
	t.Helper()
	return StartAt(t, secret, "127.0.0.1:0")
}

// StartAt is Start on addr: a test restarts a relay where it was.
func StartAt(t testing.TB, secret []byte, addr string) *relay.Server {
	t.Helper()
	s, err := relay.Listen(context.Background(), relay.ServerConfig{Listen: addr, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Allocate allocates on s with an hour's credentials for machine under
// secret, released when the test ends.
func Allocate(t testing.TB, s *relay.Server, secret []byte, machine string) *relay.Allocation {
	t.Helper()
	user, pass, _, err := relay.Credentials(secret, machine, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := relay.Allocate(ctx, relay.ClientConfig{
		Server:   s.Addr().String(),
		Username: user,
		Password: pass,
		Local:    "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}
