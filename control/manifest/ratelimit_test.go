package manifest

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

func TestRateLimitValidation(t *testing.T) {
	route := func(rl string) string {
		return "web: {command: [x], routes: [{hosts: [a.example.com]}, {hosts: [b.example.com], rate_limit: " + rl + "}]}"
	}
	const p = "services.web.routes[1].rate_limit"
	cases := []struct {
		name, svcs string
		want       []string
	}{
		{"no requests", route("{window: 1m}"), []string{p + ".requests: must be at least 1"}},
		{"negative requests", route("{requests: -5, window: 1m}"), []string{p + ".requests: must be at least 1"}},
		{"no window", route("{requests: 10}"), []string{p + ".window: must be a duration between 1s and 1h0m0s"}},
		{"window under a second", route("{requests: 10, window: 500ms}"), []string{p + ".window: must be a duration between 1s and 1h0m0s"}},
		{"window over an hour", route("{requests: 10, window: 2h}"), []string{p + ".window: must be a duration between"}},
		{"window not a duration", route("{requests: 10, window: often}"), []string{"(syntax):"}},
		{"unknown key", route("{requests: 10, window: 1m, key: cookie}"), []string{p + `.key: must be "ip" (the default), "route" or "header:<Name>"`}},
		{"header without a name", route("{requests: 10, window: 1m, key: 'header:'}"), []string{p + `.key: header "" is not a valid header name`}},
		{"header name with a space", route("{requests: 10, window: 1m, key: 'header:X Api'}"), []string{p + `.key: header "X Api" is not a valid header name`}},
		{"key in capitals", route("{requests: 10, window: 1m, key: IP}"), []string{p + ".key: must be"}},
		{"unknown field", route("{requests: 10, window: 1m, burst: 5}"), []string{"(syntax):", "field burst not found"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("namespace: a\nservices:\n  " + tc.svcs + "\n"))
			if err == nil {
				t.Fatal("accepted an invalid manifest")
			}
			me, ok := err.(*Error)
			if !ok {
				t.Fatalf("error type %T: %v", err, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if len(me.Problems) != 1 {
				t.Errorf("%d problems, want 1: %v", len(me.Problems), err)
			}
		})
	}
	// Every problem at once, each at its path.
	_, err := Parse([]byte("namespace: a\nservices:\n  " + route("{requests: 0, window: 0s, key: x}") + "\n"))
	if me, ok := err.(*Error); !ok || len(me.Problems) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
}

func TestRateLimitAllowed(t *testing.T) {
	m, err := Parse([]byte(`
namespace: a
services:
  web:
    command: [x]
    routes:
      - {hosts: [a.example.com], rate_limit: {requests: 100, window: 1m}}
      - {hosts: [b.example.com], rate_limit: {requests: 1, window: 1s, key: route}}
      - {hosts: [c.example.com], rate_limit: {requests: 5000, window: 1h, key: ip}}
      - {hosts: [d.example.com], rate_limit: {requests: 10, window: 10s, key: "header:X-Api-Key"}}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := m.Services["web"].Routes
	if rl := rs[0].RateLimit; rl == nil || rl.Requests != 100 || time.Duration(rl.Window) != time.Minute || rl.Key != "" {
		t.Fatalf("route 0: %+v", rl)
	}
	if rl := rs[3].RateLimit; rl.Key != store.RateKeyHeader+"X-Api-Key" || !rs[3].HasProtection() {
		t.Fatalf("route 3: %+v", rl)
	}
}
