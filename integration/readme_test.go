package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestReadmeUp runs the README's first command the way `make up` does
// (scripts/up.sh, here with --once and free ports) and checks that it shows
// the sample app answering through the gateway and DNS, then stops cleanly.
func TestReadmeUp(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("scripts/up.sh needs curl (make test installs it as root)")
	}
	port := func() string {
		_, p, _ := net.SplitHostPort(freeAddr(t))
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../scripts/up.sh", "--once")
	cmd.Env = append(os.Environ(), "BIN="+bins.dir, "EDGEPLANE_DATA="+t.TempDir(),
		"UP_NATS_PORT="+port(), "UP_HTTP_PORT="+port(), "UP_HTTPS_PORT="+port(), "UP_ADMIN_PORT="+port(),
		"UP_DNS_PORT="+port(), "UP_STUN_PORT="+port())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/up.sh --once: %v\n%s", err, out)
	}
	text := string(out)
	if n := strings.Count(text, "hello from hello.demo slot"); n != 4 {
		t.Fatalf("want 4 answers of the sample app through the gateway, got %d:\n%s", n, text)
	}
	if _, err := exec.LookPath("dig"); err == nil && !strings.Contains(text, "\n127.0.0.1\n") {
		t.Fatalf("DNS did not answer with the instances' address:\n%s", text)
	}
	if !strings.Contains(text, "==> stopped") {
		t.Fatalf("the demo did not stop cleanly:\n%s", text)
	}
}
