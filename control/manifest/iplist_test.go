package manifest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Allow and deny entries come out normalised, v4 and v6, addresses and
// CIDRs alike.
func TestParseIPLists(t *testing.T) {
	m, err := Parse([]byte(`
namespace: a
services:
  web:
    command: [x]
    routes:
      - hosts: [web.example.com]
        allow: [10.0.0.0/8, " 192.0.2.7 ", 2001:DB8::/32, "::ffff:198.51.100.1", 2001:db8:0:0::1/128]
        deny: [10.9.0.0/16, 2001:db8:dead::1]
`))
	if err != nil {
		t.Fatal(err)
	}
	rt := m.Services["web"].Routes[0]
	if want := []string{"10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "198.51.100.1", "2001:db8::1/128"}; !slices.Equal(rt.Allow, want) {
		t.Fatalf("allow %q, want %q", rt.Allow, want)
	}
	if want := []string{"10.9.0.0/16", "2001:db8:dead::1"}; !slices.Equal(rt.Deny, want) {
		t.Fatalf("deny %q, want %q", rt.Deny, want)
	}
	if !rt.HasProtection() {
		t.Fatal("a route with allow/deny lists is not protected")
	}
}

func TestIPListValidation(t *testing.T) {
	many := make([]string, MaxIPListEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	cases := []struct {
		name, route string
		want        []string
	}{
		{"not an address", "allow: [10.0.0.300]", []string{`services.web.routes[0].allow[0]: "10.0.0.300" is not an IP address or a CIDR`}},
		{"a host name", "deny: [10.0.0.1, example.com]", []string{`services.web.routes[0].deny[1]: "example.com" is not an IP address or a CIDR`}},
		{"bad prefix length", "allow: [10.0.0.0/33]", []string{`routes[0].allow[0]: "10.0.0.0/33" is not`}},
		{"v6 bad prefix length", "deny: [2001:db8::/129]", []string{`routes[0].deny[0]: "2001:db8::/129" is not`}},
		{"host bits set", "allow: [10.1.2.3/8]", []string{`routes[0].allow[0]: "10.1.2.3/8" has bits set past its /8: did you mean 10.0.0.0/8`}},
		{"v6 host bits set", "deny: [2001:db8::1/32]", []string{`routes[0].deny[0]: "2001:db8::1/32" has bits set past its /32: did you mean 2001:db8::/32`}},
		{"zone", `allow: ["fe80::1%eth0"]`, []string{`routes[0].allow[0]: "fe80::1%eth0" has an IPv6 zone`}},
		{"mapped CIDR", `allow: ["::ffff:10.0.0.0/104"]`, []string{`routes[0].allow[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR`}},
		{"empty entry", `deny: [""]`, []string{`routes[0].deny[0]: empty`}},
		{"empty allow list", "allow: []", []string{"services.web.routes[0].allow: an empty allow list would refuse every client"}},
		{"duplicate after normalising", "allow: [2001:db8::1, 2001:DB8:0::1]", []string{"routes[0].allow[1]: 2001:db8::1 is already at allow[0]"}},
		{"in both lists", "allow: [10.0.0.0/8, 192.0.2.1]\n        deny: [192.0.2.1]", []string{"routes[0].allow[1]: 192.0.2.1 is also at deny[0], and deny wins"}},
		{"too many", "allow: [" + strings.Join(many, ", ") + "]", []string{"routes[0].allow: 10001 entries: at most 10000"}},
		{"not a list", "allow: 10.0.0.0/8", []string{"(syntax):"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("namespace: a\nservices:\n  web:\n    command: [x]\n    routes:\n      - hosts: [web.example.com]\n        " + tc.route + "\n"))
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
}

// The largest list allowed passes, with a deny entry inside an allowed
// CIDR (an exception carved out of it, not a contradiction).
func TestIPListAtTheBound(t *testing.T) {
	many := make([]string, MaxIPListEntries)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	m, err := Parse([]byte("namespace: a\nservices:\n  web:\n    command: [x]\n    routes:\n      - hosts: [web.example.com]\n        allow: [" +
		strings.Join(many, ", ") + "]\n        deny: [10.0.0.7, 192.0.2.0/24]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m.Services["web"].Routes[0].Allow); n != MaxIPListEntries {
		t.Fatalf("%d allow entries", n)
	}
}
