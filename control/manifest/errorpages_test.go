package manifest

import (
	"strings"
	"testing"
)

// error_pages parse with numeric keys; each wrong one is refused with its
// path, alone.
func TestErrorPagesValidation(t *testing.T) {
	m, err := Parse([]byte(`
namespace: a
services:
  web:
    command: [x]
    routes:
      - hosts: [web.example.com]
        error_pages:
          502: {body: "<h1>down</h1>"}
          503: {body: '{"error":"busy"}', content_type: application/json}
          504: {body: slow, content_type: text/plain; charset=utf-8}
`))
	if err != nil {
		t.Fatal(err)
	}
	if ep := m.Services["web"].Routes[0].ErrorPages; len(ep) != 3 || ep[503].ContentType != "application/json" || ep[502].Body != "<h1>down</h1>" {
		t.Fatalf("error pages %+v", ep)
	}
	big := strings.Repeat("x", MaxErrorPageBody+1)
	cases := []struct{ name, pages, want string }{
		{"a status the gateway never answers itself", "404: {body: x}",
			"services.web.routes[0].error_pages.404: only 502, 503 and 504 have error pages"},
		{"a 500", "500: {body: x}", "services.web.routes[0].error_pages.500: only 502, 503 and 504"},
		{"no body", "503: {content_type: text/html}", "services.web.routes[0].error_pages.503.body: required"},
		{"a body over 64 KiB", "502: {body: " + big + "}", "services.web.routes[0].error_pages.502.body: is 65537 bytes; at most 65536 (64 KiB)"},
		{"not a media type", "504: {body: x, content_type: 'html'}", "services.web.routes[0].error_pages.504.content_type: not a media type"},
		{"a binary type", "504: {body: x, content_type: application/octet-stream}", `services.web.routes[0].error_pages.504.content_type: "application/octet-stream": want text/*`},
		{"a header split", `503: {body: x, content_type: "text/html\r\nSet-Cookie: a=b"}`, "services.web.routes[0].error_pages.503.content_type: a content type cannot hold a line break or NUL"},
		{"a status that is not a number", "oops: {body: x}", "(syntax)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("namespace: a\nservices:\n  web:\n    command: [x]\n    routes:\n      - hosts: [web.example.com]\n        error_pages:\n          " + tc.pages + "\n"))
			if err == nil {
				t.Fatal("accepted an invalid manifest")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if me, ok := err.(*Error); ok && len(me.Problems) != 1 {
				t.Errorf("%d problems, want 1: %v", len(me.Problems), err)
			}
		})
	}
}
