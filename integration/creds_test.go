package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Box credentials renew under traffic: with 15 s credentials, the agent,
// meshd and the gateway (its routing app and its certificate storage share
// one file) each renew theirs at two thirds of their life, over and over,
// while the gateway serves requests and deploys go on: no request fails,
// every old key is revoked once its box switched, and refused afterwards.
// A box whose credentials expired is refused at start, saying it must be
// invited again.
func TestCredsRenewalUnderTraffic(t *testing.T) {
	buildExtra(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--auth", "on", "--creds-ttl", "15s"},
		issueArgs: []string{"--ttl", "15s"}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	c.join("m1")
	gwCreds := c.issueCreds(storagenode.RoleGateway, "gw1")
	gw := startEdgeGateway(t, c, "gw1", c.url, gwCreds)
	meshCreds := c.issueCreds(storagenode.RoleMesh, "m1")
	meshDir := filepath.Join(c.dir, "mesh-m1")
	token := strings.TrimSpace(c.mustControl("machine", "invite"))
	if out, err := exec.Command(extraBins.meshd, "join", "--token", token, "--data", meshDir, "--nats", c.url, "--creds", meshCreds,
		"--machine", "m1", "--mode", "netstack", "--bind", "127.0.0.1", "--listen-port", "0").CombinedOutput(); err != nil {
		t.Fatalf("meshd join: %v\n%s", err, out)
	}
	start(t, "meshd m1", nil, extraBins.meshd, "run", "--data", meshDir, "--heartbeat-interval", "1s", "--reconcile-interval", "1s")

	// The keys they started with, kept to try them once retired.
	type firstKey struct {
		file, user string
		expires    time.Time
		refused    bool
	}
	first := map[string]*firstKey{}
	for role, file := range map[string]string{"agent": filepath.Join(c.dir, "agent-m1.creds"), "gateway": gwCreds, "mesh": meshCreds} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		copyFile := filepath.Join(c.dir, "first-"+role+".creds")
		if err := os.WriteFile(copyFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
		tok, _ := jwt.ParseDecoratedJWT(b)
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil {
			t.Fatal(err)
		}
		first[role] = &firstKey{file: copyFile, user: uc.Subject, expires: time.Unix(uc.Expires, 0)}
	}
	// tryFirst connects with each first key its box retired: refused by
	// the storage node (revoked) while it has not expired yet.
	tryFirst := func(list []store.IssuedCredential) {
		for role, k := range first {
			if k.refused {
				continue
			}
			for _, cr := range list {
				if cr.User != k.user || cr.RevokedAt.IsZero() {
					continue
				}
				before := time.Now().Before(k.expires.Add(-time.Second))
				_, err := store.Connect(store.ConnectOptions{URL: c.url, CredsFile: k.file, Timeout: 2 * time.Second})
				switch {
				case err == nil:
					t.Fatalf("the %s's first key, retired, connected", role)
				case before && !strings.Contains(strings.ToLower(err.Error()), "authorization"):
					t.Fatalf("the %s's first key, retired: %v, want refused by the storage node", role, err)
				}
				k.refused = true
				t.Logf("the %s's first key, retired, refused (before it expired: %v): %v", role, before, err)
			}
		}
	}

	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--gateway-wait", "10s")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})
	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 4, stop)

	// Deploys go on until each box renewed twice (a renewed key renews in
	// turn) and retired what it renewed from.
	renewals := func() map[string]int {
		n := map[string]int{}
		for _, cr := range c.credsList(t) {
			if cr.How == store.IssuedByRenewal {
				n[cr.Role]++
			}
		}
		return n
	}
	deadline := time.Now().Add(90 * time.Second)
	applies := 0
	// An apply a second: the deploys are the agent's traffic, not a
	// deploy load test.
	pace := time.NewTicker(time.Second)
	defer pace.Stop()
	for v := 2; ; v++ {
		<-pace.C
		n := renewals()
		tryFirst(c.credsList(t))
		if n["agent"] >= 2 && n["mesh"] >= 2 && n["gateway"] >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewals after 90 s of 15 s credentials: %v", n)
		}
		manifest := strings.Replace(helloV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d"`, v), 1)
		c.mustControl("deploy", "apply", "-f", c.manifest(fmt.Sprintf("v%d.yaml", v), manifest), "--drain-grace", "2s", "--gateway-wait", "10s")
		applies++
	}
	// One more apply with every box on renewed credentials.
	c.mustControl("deploy", "apply", "-f", c.manifest("last.yaml", strings.Replace(helloV1, `VERSION: "1"`, `VERSION: "last"`, 1)),
		"--drain-grace", "2s", "--gateway-wait", "10s")
	close(stop)
	wg.Wait()
	t.Logf("renewals %v; %d applies; %d requests, %d failed %v", renewals(), applies+1, l.ok.Load()+l.failed.Load(), l.failed.Load(), l.errs)
	if l.failed.Load() > 0 {
		t.Errorf("%d requests failed while the boxes renewed their credentials: %v", l.failed.Load(), l.errs)
	}

	// Every key a renewal replaced is revoked, the first ones refused.
	// Every key its box switched away from is revoked: a key with a
	// successor in use (in a file now, or renewed in turn). A renewal
	// whose answer was lost leaves a successor never used, and its
	// predecessor in use.
	eventually(t, 20*time.Second, "every key a box switched away from revoked", func() bool {
		inUse := map[string]bool{}
		for _, file := range []string{filepath.Join(c.dir, "agent-m1.creds"), gwCreds, meshCreds} {
			b, _ := os.ReadFile(file)
			if r, err := store.UserOfCreds(b); err == nil {
				inUse[r.User] = true
			}
		}
		list := c.credsList(t)
		for _, cr := range list {
			if cr.RenewedFrom == "" || !(inUse[cr.User] || renewedFrom(list, cr.User)) {
				continue
			}
			for _, prev := range list {
				if prev.User == cr.RenewedFrom && prev.RevokedAt.IsZero() {
					return false
				}
			}
		}
		return true
	})
	for role, k := range first {
		if !k.refused {
			t.Errorf("the %s's first key was not seen retired and refused", role)
		}
	}
	for role, file := range map[string]string{"agent": filepath.Join(c.dir, "agent-m1.creds"), "gateway": gwCreds, "mesh": meshCreds} {
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("the %s's renewed credentials file: %v %v", role, fi, err)
		}
	}
	// A renewal whose answer was lost (a revocation changing the edge
	// account just then) is tried again: said, and not fatal.
	for _, p := range []*proc{gw.proc, c.agents["m1"]} {
		for _, l := range lines(p.output(), "renewing the credentials") {
			t.Logf("retried: %s", l)
		}
	}

	// A box whose credentials expired: refused at start, and told what to
	// do.
	expired := filepath.Join(c.dir, "expired.creds")
	c.mustControl("creds", "issue", "--role", "agent", "--machine", "m9", "--data", c.serverDir(), "-o", expired, "--ttl", "1s")
	time.Sleep(2 * time.Second) // JWT expiry has one-second granularity
	_, errOut, code := runControl(t, []string{"EDGEPLANE_NATS=" + c.url, "EDGEPLANE_NATS_CREDS=" + expired}, "agent", "--data", filepath.Join(c.dir, "agents", "m9"))
	if code != 1 || !strings.Contains(errOut, "unauthorized") || !strings.Contains(errOut, "expired at") || !strings.Contains(errOut, "must be invited again") {
		t.Fatalf("an agent with expired credentials: exit %d\n%s", code, errOut)
	}
}

// renewedFrom reports whether some record of list was renewed from user.
func renewedFrom(list []store.IssuedCredential, user string) bool {
	for _, cr := range list {
		if cr.RenewedFrom == user {
			return true
		}
	}
	return false
}

// credsList is `control creds ls`, read from the store.
func (c *cluster) credsList(t *testing.T) []store.IssuedCredential {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := c.store.ListCredentials(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return list
}
