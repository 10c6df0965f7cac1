package fleetca

import (
	"bytes"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A rotation walks an auth dir through its steps in order, a generation
// each: after begin and switch both CAs are trusted, after finish the new
// one alone.
func TestRotationSteps(t *testing.T) {
	dir := t.TempDir()
	if _, err := storagenode.LoadAuth(dir, true); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(dir, "", ""); err != nil {
		t.Fatal(err)
	}
	show := func() string {
		var b bytes.Buffer
		if err := Show(&b, dir); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if s := show(); strings.Count(s, "trusted CA:") != 1 || !strings.Contains(s, "generation 1, rotation none\n") {
		t.Fatalf("after init:\n%s", s)
	}
	for i, step := range []string{"begin", "switch", "finish"} {
		f, err := Steps[step].Run(dir)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if f.Generation != 2+i || Steps[step].Next == "" {
			t.Fatalf("%s: generation %d, next %q", step, f.Generation, Steps[step].Next)
		}
		if want := []int{2, 2, 1}[i]; strings.Count(show(), "trusted CA:") != want {
			t.Fatalf("after %s, want %d trusted CAs:\n%s", step, want, show())
		}
	}
}
