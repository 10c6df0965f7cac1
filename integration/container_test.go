package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/internal/enginetest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const imageApp = `
namespace: shop
services:
  web:
    image: @IMAGE@
    replicas: 2
    read_only: true
    resources: {memory: 64Mi, cpus: 0.5}
    readiness: {path: /healthz, timeout: 20s}
    routes: [{hosts: [shop.example.com]}]
`

// versionVia asks the gateway which image version answers.
func versionVia(gw *gateway, host string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+gw.http+"/?format=json", nil)
	req.Host = host
	resp, err := gwClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %s", resp.Status)
	}
	var info map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return "", err
	}
	return info["version"], nil
}

// servesVersion reports whether n requests through gw all reach version v.
func servesVersion(gw *gateway, v string, n int) bool {
	for range n {
		if got, err := versionVia(gw, "shop.example.com"); err != nil || got != v {
			return false
		}
	}
	return true
}

// Container workloads over real podman and real Docker engines: an image
// deployed and pinned by ID; a redeploy under load after the tag moved (0
// failed requests); a rollback that runs the old ID though the tag moved;
// a rollback to a removed image refused before anything starts; an image
// named by digest in a registry pulled by the apply, and a digest the
// registry lacks refused before anything starts; an agent restart that
// adopts the same containers; a container killed with kill -9 restarted
// and routed again; a crash-looping container backed off; a stray container
// with our labels reported by doctor.
func TestContainerWorkloads(t *testing.T) {
	reg := enginetest.StartRegistry(t)
	hello := enginetest.BuildStatic(t, "github.com/edgeplane/edgeplane/examples/hello", t.TempDir())
	enginetest.Run(t, func(t *testing.T, e *enginetest.Engine) { testContainerWorkloads(t, e, reg, hello) })
}

func testContainerWorkloads(t *testing.T, e *enginetest.Engine, reg *enginetest.Registry, hello string) {
	ctx := context.Background()
	tag := fmt.Sprintf("localhost/edgeplane-it-%d:v1", time.Now().UnixNano())
	id1 := e.BuildImage(t, tag, hello, "ENV VERSION=1")
	c := newCluster(t)
	c.agentArgs = []string{"--engine", e.Host, "--restart-backoff", "500ms", "--restart-backoff-max", "4s"}
	c.join("m1")
	gw := c.startGateway("gw1")
	manifest := c.manifest("image.yaml", strings.ReplaceAll(imageApp, "@IMAGE@", tag))
	apply := func(args ...string) string {
		return c.mustControl(append([]string{"deploy", "apply", "-f", manifest, "--drain-grace", "500ms", "--stop-grace", "2s"}, args...)...)
	}

	// 1. Deployed and pinned.
	out := apply()
	if !strings.Contains(out, "image "+tag+" is "+id1[:len("sha256:")+12]) {
		t.Fatalf("the apply does not say what it pinned:\n%s", out)
	}
	first, err := c.store.LiveCommit(ctx, "shop")
	if err != nil || first.Manifest.Services["web"].ImageID != id1 {
		t.Fatalf("the commit does not record the image ID: %+v %v", first.Manifest.Services["web"], err)
	}
	insts := c.instances("shop")
	for _, in := range insts {
		if in.Driver != "container" || in.Container == "" {
			t.Fatalf("not a container: %+v", in)
		}
	}
	eventually(t, 10*time.Second, "version 1 to be served", func() bool { return servesVersion(gw, "1", 4) })
	// The driver copies a container's output into the instance's log as
	// the engine streams it, and podman's stream polls its log file: a
	// line can reach the log ~250ms after the container answers, later on
	// a loaded machine.
	var logs string
	eventually(t, 10*time.Second, "both containers' output in control logs", func() bool {
		logs = c.mustControl("logs", "shop/web")
		return strings.Count(logs, "hello listening on") >= 2
	})
	if strings.Count(logs, "hello listening on") != 2 {
		t.Fatalf("control logs of the containers:\n%s", logs)
	}

	// 2. The agent restarts: it adopts the same containers.
	c.agents["m1"].stop(syscall.SIGKILL)
	r := c.restartAgent("m1")
	if got := len(lines(r.output(), "adopted instance")); got != 2 {
		t.Fatalf("adopted %d of 2 containers:\n%s", got, r.output())
	}
	for i, in := range c.instances("shop") {
		if in.Container != insts[i].Container || in.State != store.InstanceReady {
			t.Fatalf("after the agent restart %+v, before %+v", in, insts[i])
		}
	}

	// 3. kill -9 of a container's process: restarted, routed again.
	victim := insts[0]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 20*time.Second, "the killed container to run again", func() bool {
		for _, in := range c.instances("shop") {
			if in.ID == victim.ID {
				return in.State == store.InstanceReady && in.Restarts == 1 && in.Container != victim.Container
			}
		}
		return false
	})
	eventually(t, 10*time.Second, "both instances to be routed", func() bool {
		return len(lastEndpoints(t, c)) == 2
	})
	healed := time.Since(killed)

	// 4. The tag moves; the same manifest redeploys under load.
	id2 := e.BuildImage(t, tag, hello, "ENV VERSION=2")
	w := startWrk(t, gw.http, "shop.example.com")
	apply()
	eventually(t, 10*time.Second, "version 2 to be served", func() bool { return servesVersion(gw, "2", 4) })
	res := w.stop(t)
	if res.requests == 0 || res.non2xx != 0 || res.socketErrors != 0 {
		t.Fatalf("wrk during the redeploy: %s\n%s", res, res.out)
	}
	if live, _ := c.store.LiveCommit(ctx, "shop"); live.Manifest.Services["web"].ImageID != id2 {
		t.Fatalf("the redeploy pinned %s, want %s", live.Manifest.Services["web"].ImageID, id2)
	}

	// 5. Rollback to the first commit runs its image ID, not the tag's.
	c.mustControl("deploy", "rollback", "shop", "--to", first.ID, "--drain-grace", "500ms", "--stop-grace", "2s")
	eventually(t, 10*time.Second, "version 1 to be served after the rollback", func() bool { return servesVersion(gw, "1", 4) })

	// 6. Back to the tag (v2), then the first image goes: a rollback to it
	// is refused before anything starts.
	apply()
	if _, err := e.CLI(ctx, "rmi", "-f", id1); err != nil {
		t.Fatal(err)
	}
	before := c.instances("shop")
	head := routingHead(t, c)
	_, errOut, code := c.control("deploy", "rollback", "shop", "--to", first.ID)
	if code != 1 || !strings.Contains(errOut, "no longer on machine m1") || !strings.Contains(errOut, id1) || !strings.Contains(errOut, tag) {
		t.Fatalf("rollback to a removed image: exit %d\n%s", code, errOut)
	}
	if after := c.instances("shop"); len(after) != len(before) || routingHead(t, c) != head {
		t.Fatalf("a refused rollback changed something: %d instances (was %d)", len(after), len(before))
	}

	// 7. An image named by digest in a registry, which the engine does not
	// have, is pulled by the apply and pinned; a digest the registry lacks
	// is refused before anything starts, naming the image.
	id3 := e.BuildImage(t, "localhost/edgeplane-it-digest:v3", hello, "ENV VERSION=3")
	repo := reg.Addr + "/edgeplane-it-" + e.Name
	byDigest := repo + "@" + e.Push(t, id3, repo+":v3")
	if _, err := e.CLI(ctx, "rmi", "-f", id3); err != nil {
		t.Fatal(err)
	}
	digestManifest := c.manifest("digest.yaml", strings.ReplaceAll(imageApp, "@IMAGE@", byDigest))
	out = c.mustControl("deploy", "apply", "-f", digestManifest, "--drain-grace", "500ms", "--stop-grace", "2s")
	if !strings.Contains(out, "image "+byDigest+" is "+id3[:len("sha256:")+12]) {
		t.Fatalf("the apply by digest does not say what it pinned:\n%s", out)
	}
	eventually(t, 10*time.Second, "version 3 (pulled by digest) to be served", func() bool { return servesVersion(gw, "3", 4) })
	missing := repo + "@sha256:" + strings.Repeat("0", 64)
	before, head = c.instances("shop"), routingHead(t, c)
	containers := func() []string {
		ids, err := e.CLI(ctx, "ps", "-a", "-q")
		if err != nil {
			t.Fatal(err)
		}
		return slices.Sorted(slices.Values(strings.Fields(ids)))
	}
	had := containers()
	_, errOut, code = c.control("deploy", "apply", "-f", c.manifest("missing.yaml", strings.ReplaceAll(imageApp, "@IMAGE@", missing)))
	if code != 1 || !strings.Contains(errOut, "image "+missing+" is not on machine m1 and could not be pulled") {
		t.Fatalf("apply of a digest the registry lacks: exit %d\n%s", code, errOut)
	}
	if after := c.instances("shop"); len(after) != len(before) || routingHead(t, c) != head || !servesVersion(gw, "3", 4) {
		t.Fatalf("a refused apply changed something: %d instances (was %d)", len(after), len(before))
	}
	if now := containers(); !slices.Equal(now, had) {
		t.Fatalf("containers after a refused apply: %v, before %v", now, had)
	}

	// 8. A container with our labels that no agent runs is a stray.
	port := freeAddr(t)[len("127.0.0.1:"):]
	if _, err := e.CLI(ctx, "run", "-d", "--network", "host", "--name", "edgeplane-stray-"+port,
		"--label", "io.edgeplane.instance=stray-"+port, "--label", "io.edgeplane.namespace=shop", "--label", "io.edgeplane.service=web",
		"-e", "PORT="+port, id2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.CLI(context.Background(), "rm", "-f", "edgeplane-stray-"+port) })
	rep, code, _ := doctorRun(t, c, gw)
	if code != 1 {
		t.Fatalf("doctor with a stray container: exit %d", code)
	}
	wantFinding(t, rep, doctor.LayerMachines, `runs instance stray-`+port+` \(shop/web\) that has no record: a stray`)

	// 9. A container that keeps crashing is backed off and shown so.
	crashy := c.manifest("crashy.yaml", strings.Replace(strings.ReplaceAll(imageApp, "@IMAGE@", tag), "read_only: true",
		"read_only: true\n    env: {HELLO_EXIT_AFTER: 1s}", 1))
	c.mustControl("deploy", "apply", "-f", crashy, "--drain-grace", "100ms", "--stop-grace", "2s")
	var looping store.InstanceRecord
	eventually(t, 40*time.Second, "a crash loop in backoff", func() bool {
		for _, in := range c.instances("shop") {
			if in.State == store.InstanceBackoff && in.Restarts >= 3 && in.LastExit == "exited with status 3" {
				looping = in
				return true
			}
		}
		return false
	})
	if ls := c.mustControl("instances"); !regexp.MustCompile(`backoff\s+\d+\s+exited with status 3`).MatchString(ls) {
		t.Fatalf("control instances does not show the crash loop:\n%s", ls)
	}
	t.Logf("redeploy after the tag moved under wrk: %s; container killed with kill -9 routed again after %s; crash loop at restart %d waits %s",
		res, healed.Round(10*time.Millisecond), looping.Restarts, looping.NextRestart.Sub(looping.LastExitAt).Round(10*time.Millisecond))
	c.mustControl("deploy", "destroy", "shop", "--drain-grace", "100ms", "--stop-grace", "2s")
}

// lastEndpoints is what the routing sends shop/web's traffic to now, as a
// cold start reads it (the service's own subject or its namespace's
// latest routing batch, whichever is later).
func lastEndpoints(t *testing.T, c *cluster) []store.Endpoint {
	t.Helper()
	rs, err := c.store.LoadRouting(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range rs.Services {
		if ev.Namespace == "shop" && ev.Service == "web" {
			return ev.Endpoints
		}
	}
	t.Fatal("shop/web is not routed")
	return nil
}

// Without a container engine anywhere, an image service is refused before
// anything is written, saying why; an agent asked directly to start one
// refuses it the same way. (No container engine needed.)
func TestImageWithoutAnEngineIsRefused(t *testing.T) {
	c := newCluster(t)
	c.agentArgs = []string{"--engine", "none"}
	c.join("m1")
	statusBucket := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	statuses, head := countKeys(t, statusBucket), routingHead(t, c)
	manifest := c.manifest("image.yaml", strings.ReplaceAll(imageApp, "@IMAGE@", "localhost/edgeplane-none:v1"))
	for _, cmd := range [][]string{{"deploy", "preview", "-f", manifest}, {"deploy", "apply", "-f", manifest}} {
		_, errOut, code := c.control(cmd...)
		if code != 1 || !strings.Contains(errOut, "no reachable active machine has a container engine for shop.web (image localhost/edgeplane-none:v1)") {
			t.Fatalf("%s: exit %d\n%s", cmd[1], code, errOut)
		}
	}
	if n := countKeys(t, statusBucket); n != statuses || routingHead(t, c) != head || len(c.instances("shop")) != 0 {
		t.Fatalf("a refused image manifest wrote something: %d statuses (was %d)", n, statuses)
	}
	var rep store.StartReply
	err := c.store.Call(context.Background(), "m1", store.CmdStartCandidate, store.StartRequest{
		Instance: store.InstanceRecord{ID: "direct", Namespace: "shop", Service: "web"}, Spec: store.ServiceSpec{Image: "hello", ImageID: "sha256:" + strings.Repeat("0", 64)}}, &rep)
	if se := store.AsError(err); se == nil || se.Code != store.CodeUnavailable || !strings.Contains(se.Message, "machine m1 has no container engine for image hello") {
		t.Fatalf("start of an image on an agent without an engine: %v", err)
	}
	if len(c.instances("shop")) != 0 {
		t.Fatal("a refused start left a record")
	}
}
