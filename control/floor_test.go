package main

import (
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store/storetest"
)

// A CLI of a generation below the store's floor says so, too_old naming
// the release the store needs, for a read and for a write alike.
func TestCLIRefusesAStoreAboveItsGeneration(t *testing.T) {
	srv := storetest.Start(t)
	if code, _, errOut := runCLI(t, "status", "--nats", srv.URL); code != 0 {
		t.Fatalf("no floor: control status: exit %d, stderr %q", code, errOut)
	}
	storetest.FutureFloor(t, srv.Store, 99, "9.0.0")
	for _, args := range [][]string{{"status"}, {"machine", "drain", "m1"}} {
		code, _, errOut := runCLI(t, append(args, "--nats", srv.URL)...)
		if code != 1 || !strings.Contains(errOut, "error: too_old: this store needs edgeplane >= 9.0.0 (schema generation 99); this is control cli") {
			t.Fatalf("control %s on floor 99: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
}
