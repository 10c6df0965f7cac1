package integration

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// attackDashboardRebinding: a page the operator visits rebinds its own
// name to 127.0.0.1 and reads the loopback dashboard (open there, no
// login). A real `control server` serving the dashboard on loopback, run
// with the box's control credentials as a client of the store, answers a
// request naming another host with 421 and why, never a page, and serves
// the operator asking for localhost as before.
func attackDashboardRebinding(t *testing.T, f *attackFixture) {
	c := f.c
	dash := storetest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(dash)
	// A second control server of this store, as an operator runs one for
	// the dashboard: it certifies its signer under the store's root.
	data := filepath.Join(t.TempDir(), "dash")
	if err := os.MkdirAll(filepath.Join(data, "auth"), 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := os.ReadFile(filepath.Join(c.serverDir(), "auth", signing.RootFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "auth", signing.RootFile), root, 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "control server (dashboard)", c.natsEnv("control", ""), bins.control, "server", "--data", data,
		"--nats", c.url, "--creds", c.creds, "--storage=false", "--stun-listen", "", "--status-flush", "0", "--enroll-listen", "off",
		"--dashboard-listen", dash)
	defer func() { _ = p.cmd.Process.Kill(); <-p.done }()
	p.waitOutput(t, `dashboard on http://`+regexp.QuoteMeta(dash), 30*time.Second)
	get := func(host string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+dash+"/", nil)
		req.Host = host
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, host := range []string{"attacker.example", "attacker.example:" + port, "127.0.0.1.attacker.example:" + port} {
		code, body := get(host)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "answers to localhost, 127.0.0.1 or [::1] only") {
			t.Fatalf("Host %s: %d %.300s", host, code, body)
		}
		if strings.Contains(body, "shop") || strings.Contains(body, "<html") {
			t.Fatalf("Host %s: the dashboard's page was served: %.300s", host, body)
		}
	}
	if !strings.Contains(p.output(), "dashboard request for another host refused") {
		t.Errorf("the refusal was not logged:\n%s", p.output())
	}
	if code, body := get("localhost:" + port); code != http.StatusOK || !strings.Contains(body, "shop") {
		t.Fatalf("the operator's own request: %d %.300s", code, body)
	}
}

// attackPlaintextCredentials: a box's real credentials, as written before
// credentials carried the fleet CA, pointed at a plaintext NATS on another
// box (someone on the path, or a node set up without TLS). The client
// refuses before it dials, with a structured error naming the fix, and
// the server sees no connection at all, so the credentials' proof never
// crosses the wire.
func attackPlaintextCredentials(t *testing.T, f *attackFixture) {
	lab := newNetLab(t, 1)
	addr := lab.subnet + ".254" // the bridge's, in this namespace: not loopback
	ns, err := server.NewServer(&server.Options{Host: addr, Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the plaintext server did not start")
	}
	url := "nats://" + net.JoinHostPort(addr, strconv.Itoa(ns.Addr().(*net.TCPAddr).Port))
	for _, stolen := range []string{f.agentCreds, f.gwCreds, f.c.creds} {
		b, err := os.ReadFile(stolen)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte("-----BEGIN CERTIFICATE-----")); i >= 0 {
			b = b[:i]
		}
		old := filepath.Join(t.TempDir(), "old.creds")
		if err := os.WriteFile(old, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := runControl(t, []string{"EDGEPLANE_NATS=" + url, "EDGEPLANE_NATS_CREDS=" + old}, "status")
		if code == 0 || !strings.Contains(errOut, "plaintext_refused") || !strings.Contains(errOut, "--tls-ca") {
			t.Fatalf("control status with %s over plaintext to %s: exit %d\n%s\n%s", filepath.Base(stolen), url, code, out, errOut)
		}
	}
	v, err := ns.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.TotalConnections != 0 {
		t.Fatalf("the plaintext server saw %d connections", v.TotalConnections)
	}
}
