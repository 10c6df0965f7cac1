package rollout

import (
	"testing"

	"github.com/edgeplane/edgeplane/internal/version"
)

// One minor release at a time: patches are free, a new major is a step
// from any minor of the one before, and a downgrade is not this rule's.
func TestSkipsAStep(t *testing.T) {
	for _, c := range []struct {
		from, to string
		skips    bool
	}{
		{"0.38.0", "0.38.5", false},
		{"0.38.2", "0.39.0", false},
		{"0.38.2", "0.39.7", false},
		{"0.38.2", "0.40.0", true},
		{"0.38.2", "1.0.0", false},
		{"0.38.2", "1.1.0", true},
		{"0.38.2", "2.0.0", true},
		{"1.3.0", "1.1.0", false},
		{"1.1.0", "1.2.0-rc1", false},
	} {
		from, err := version.Parse(c.from)
		if err != nil {
			t.Fatal(err)
		}
		to, err := version.Parse(c.to)
		if err != nil {
			t.Fatal(err)
		}
		if got := skipsAStep(from, to); got != c.skips {
			t.Errorf("%s → %s: skips a step %v, want %v", c.from, c.to, got, c.skips)
		}
	}
}
