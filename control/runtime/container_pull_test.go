package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/enginetest"
)

// Pull by digest from a real registry on loopback, on each engine, through
// the path `deploy apply` takes (image.resolve): an image pushed and then
// removed from the engine is pulled by name@digest, resolves to the ID it
// was built with and runs; a digest the registry does not have is an
// ErrNoImage naming the image, and nothing is created.
func TestContainerPullByDigest(t *testing.T) {
	reg := enginetest.StartRegistry(t)
	hello := enginetest.BuildStatic(t, "github.com/edgeplane/edgeplane/examples/hello", t.TempDir())
	enginetest.Run(t, func(t *testing.T, e *enginetest.Engine) {
		ctx := context.Background()
		built := e.BuildImage(t, "localhost/edgeplane-pull:v1", hello, "ENV VERSION=pulled-"+e.Name)
		repo := reg.Addr + "/edgeplane-pull-" + e.Name
		digest := e.Push(t, built, repo+":v1")
		// The engine forgets the image (and the tags pointing at it): the
		// resolve below has to pull.
		if _, err := e.CLI(ctx, "rmi", "-f", built); err != nil {
			t.Fatal(err)
		}
		d, err := runtime.ConnectEngine(ctx, e.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ref := repo + "@" + digest
		began := time.Now()
		img, err := d.ResolveImage(ctx, ref)
		if err != nil {
			t.Fatalf("resolving %s: %v", ref, err)
		}
		t.Logf("%s pulled %s in %s", e.Name, ref, time.Since(began).Round(time.Millisecond))
		if img.ID != built || !slices.Contains(img.RepoDigests, ref) {
			t.Fatalf("resolved %s to %+v, want ID %s with repo digest %s", ref, img, built, ref)
		}
		// Resolved again: found in the store, no second pull needed.
		if again, err := d.ResolveImage(ctx, ref); err != nil || again.ID != built {
			t.Fatalf("resolving %s again: %+v %v", ref, again, err)
		}
		port := freePort(t)
		h, err := d.Start(ctx, runtime.Spec{ID: fmt.Sprintf("pull-%d", time.Now().UnixNano()), Image: img.ID, Host: "127.0.0.1", Port: port})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Stop(context.Background(), h, time.Second) })
		eventually(t, "the pulled image to answer", func() bool { return version(port) == "pulled-"+e.Name })
		if err := d.Stop(ctx, h, 2*time.Second); err != nil {
			t.Fatal(err)
		}

		// A digest the registry does not have: refused, naming the image,
		// and neither a resolve nor a start by that reference creates
		// anything.
		missing := repo + "@sha256:" + strings.Repeat("0", 64)
		_, err = d.ResolveImage(ctx, missing)
		if !errors.Is(err, runtime.ErrNoImage) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("resolving a digest the registry lacks: %v", err)
		}
		t.Logf("%s: %v", e.Name, err)
		_, err = d.Start(ctx, runtime.Spec{ID: fmt.Sprintf("missing-%d", time.Now().UnixNano()), Image: missing, Host: "127.0.0.1", Port: port})
		if !errors.Is(err, runtime.ErrNoImage) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("starting a digest the registry lacks: %v", err)
		}
		if list, err := d.List(ctx); err != nil || len(list) != 0 {
			t.Fatalf("containers after refused pulls: %+v %v", list, err)
		}
		if ids, err := e.CLI(ctx, "ps", "-a", "-q"); err != nil || ids != "" {
			t.Fatalf("%s has containers after refused pulls: %q %v", e.Name, ids, err)
		}
	})
}

// The same digest resolves to the same image ID on podman and on Docker,
// whichever engine built and pushed it: what lets `deploy apply` require
// one ID from every engine of a fleet that mixes them.
func TestContainerDigestSameOnBothEngines(t *testing.T) {
	reg := enginetest.StartRegistry(t)
	hello := enginetest.BuildStatic(t, "github.com/edgeplane/edgeplane/examples/hello", t.TempDir())
	ctx := context.Background()
	engines := map[string]*enginetest.Engine{}
	drivers := map[string]*runtime.Container{}
	for _, name := range enginetest.Names {
		engines[name] = enginetest.Start(t, name)
		d, err := runtime.ConnectEngine(ctx, engines[name].Host)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		drivers[name] = d
	}
	for _, builder := range enginetest.Names {
		e := engines[builder]
		built := e.BuildImage(t, "localhost/edgeplane-shared:v1", hello, "ENV BUILT_BY="+builder)
		repo := reg.Addr + "/edgeplane-shared-" + builder
		ref := repo + "@" + e.Push(t, built, repo+":v1")
		for _, name := range enginetest.Names {
			img, err := drivers[name].ResolveImage(ctx, ref)
			if err != nil || img.ID != built {
				t.Fatalf("%s resolved %s (built and pushed by %s as %s) to %+v %v", name, ref, builder, built, img, err)
			}
		}
	}
}

// version asks the hello app on port which VERSION it runs, "" if it
// does not answer.
func version(port int) string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/?format=json", port))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var info map[string]string
	b, _ := io.ReadAll(resp.Body)
	if json.Unmarshal(b, &info) != nil {
		return ""
	}
	return info["version"]
}
