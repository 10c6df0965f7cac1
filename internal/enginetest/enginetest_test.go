package enginetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// A test that ends with its container still running leaves nothing
// behind: no container process, no engine process, no mount, no storage.
func TestCleanupLeavesNothing(t *testing.T) {
	if why := Available(); why != "" {
		t.Skip(why)
	}
	hello := BuildStatic(t, "github.com/edgeplane/edgeplane/examples/hello", t.TempDir())
	for _, name := range Names {
		var dir string
		var port int
		t.Run(name, func(t *testing.T) {
			e := Start(t, name)
			dir = e.dir
			img := e.BuildImage(t, "localhost/enginetest-left:v1", hello)
			port = freePort(t)
			if _, err := e.CLI(context.Background(), "run", "-d", "--network", "host", "-e", "HOST=127.0.0.1", "-e", fmt.Sprintf("PORT=%d", port), img); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for !answers(port) {
				if time.Now().After(deadline) {
					t.Fatal("the container never answered")
				}
				time.Sleep(20 * time.Millisecond)
			}
			// The container's own process is found by its root (its
			// command line, /app, does not name the dir).
			found := false
			for _, p := range processesUnder(dir) {
				found = found || p.what == "/app"
			}
			if !found {
				t.Fatalf("processesUnder does not find the container's process: %v", processesUnder(dir))
			}
		})
		if dir == "" {
			continue // it did not start: the subtest failed saying why
		}
		if left := processesUnder(dir); len(left) > 0 {
			t.Errorf("%s: processes left: %v", name, left)
		}
		if answers(port) {
			t.Errorf("%s: the container still answers", name)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s: %s is still there: %v", name, dir, err)
		}
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func answers(port int) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}
