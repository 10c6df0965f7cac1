package manifest

import (
	"strings"
	"testing"
)

// A route's access_log: header names each once, nothing asked of a route
// that logs nothing; what is right parses into the route.
func TestAccessLogValidation(t *testing.T) {
	cases := []struct{ name, route, want string }{
		{"bad header", "access_log: {headers: ['X Tenant']}", "services.web.routes[0].access_log.headers[0]: not a valid header name"},
		{"header twice", "access_log: {headers: [x-tenant, X-Tenant]}", "services.web.routes[0].access_log.headers[1]: header X-Tenant is already at headers[0]"},
		{"off with query", "access_log: {off: true, query: true}", "services.web.routes[0].access_log: off writes no access line: query and headers do not apply"},
		{"too many headers", "access_log: {headers: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]}", "services.web.routes[0].access_log.headers: at most 16 headers"},
		{"unknown field", "access_log: {cookies: true}", "(syntax):"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("namespace: a\nservices:\n  web: {command: [x], routes: [{hosts: [a.example.com], " + tc.route + "}]}\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if me, ok := err.(*Error); ok && len(me.Problems) != 1 {
				t.Errorf("%d problems, want 1: %v", len(me.Problems), err)
			}
		})
	}
	m, err := Parse([]byte("namespace: a\nservices:\n  web: {command: [x], routes: [{hosts: [a.example.com], access_log: {query: true, headers: [X-Tenant, Authorization]}}, {hosts: [b.example.com], access_log: {off: true}}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs := m.Services["web"].Routes
	if al := rs[0].AccessLog; al == nil || !al.Query || len(al.Headers) != 2 || al.Off {
		t.Fatalf("route 0 access_log %+v", al)
	}
	if al := rs[1].AccessLog; al == nil || !al.Off {
		t.Fatalf("route 1 access_log %+v", al)
	}
}
