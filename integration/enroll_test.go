package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/store/invites"
)

// A box joins a TLS fleet with its invite and nothing else: `control agent
// --join` enrolls it (checking the storage node against the CA the invite
// names, sending only public keys), writes its own credentials and serves.
// A restart needs only its data dir. An invite handed out for another
// fleet's CA enrolls nothing.
func TestAgentJoinsWithAnInviteAlone(t *testing.T) {
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--auth", "on", "--enroll-listen", "127.0.0.1:0"}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	m := regexp.MustCompile(`enrollment of invited boxes on https://(\S+)/v1/enroll`).FindStringSubmatch(c.server.output())
	if m == nil {
		t.Fatalf("the server does not say where it enrolls:\n%s", c.server.output())
	}
	enrollAt := m[1]
	token := strings.TrimSpace(c.mustControl("machine", "invite", "--region", "eu"))
	if cas, err := invites.CAs(token); err != nil || len(cas) != 1 {
		t.Fatalf("the invite names CAs %v (%v): %s", cas, err, token)
	}
	dir := filepath.Join(c.dir, "agents", "box1")
	env := []string{"EDGEPLANE_NATS=" + c.url} // no credentials at all
	p := start(t, "agent box1", env, bins.control, "agent", "--data", dir, "--join", token, "--machine", "box1", "--enroll", enrollAt)
	p.waitOutput(t, `agent serving`, 20*time.Second)
	if !strings.Contains(p.output(), "enrolled machine box1: credentials (keys made on this box) in "+filepath.Join(dir, "agent.creds")) {
		t.Fatalf("agent output:\n%s", p.output())
	}
	b, err := os.ReadFile(filepath.Join(dir, "agent.creds"))
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := jwt.ParseDecoratedJWT(b)
	if uc, err := jwt.DecodeUserClaims(tok); err != nil || !strings.Contains(strings.Join(uc.Tags, ","), "role:agent") {
		t.Fatalf("agent credentials: %v", err)
	}
	c.agents["box1"] = p
	ls := c.mustControl("machine", "ls")
	if !strings.Contains(ls, "box1") || !strings.Contains(ls, "eu") {
		t.Fatalf("machine ls:\n%s", ls)
	}
	// A restart from the data dir alone.
	p.stop(syscall.SIGTERM)
	r := start(t, "agent box1 (restarted)", env, bins.control, "agent", "--data", dir)
	r.waitOutput(t, `agent serving`, 20*time.Second)
	c.agents["box1"] = r

	// An invite naming another fleet's CA: the box refuses this node.
	other := strings.Split(strings.TrimSpace(c.mustControl("machine", "invite")), ".")[0] + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	out, errOut, code := runControl(t, env, "agent", "--data", filepath.Join(c.dir, "agents", "box2"), "--join", other, "--machine", "box2", "--enroll", enrollAt)
	if code != 1 || !strings.Contains(errOut, "error: tls:") || !strings.Contains(errOut, "holds no CA the invite names") {
		t.Fatalf("another fleet's invite: exit %d\n%s\n%s", code, out, errOut)
	}
}
