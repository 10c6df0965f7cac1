package manifest

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Layer-4 fields parse inline in a service, passthrough hosts come out
// normalised as route hosts do, and their entry points are named by path.
func TestParseLayer4(t *testing.T) {
	m, err := Parse([]byte(`
namespace: a
services:
  db:
    command: [x]
    tcp: [{port: 5432}, {port: 5433}]
    tls_passthrough: {hosts: [DB.Example.com., bücher.example]}
    drain_timeout: 2m
  dns:
    command: [x]
    tcp: [{port: 53}]
    udp: [{port: 53}]
  web:
    command: [x]
    udp: [{port: 5353}]
    routes: [{hosts: [web.example.com]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	db := m.Services["db"]
	if got := strings.Join(db.PassthroughHosts(), ","); got != "db.example.com,xn--bcher-kva.example" {
		t.Fatalf("passthrough hosts not normalised: %s", got)
	}
	if db.Drain() != 2*time.Minute || len(db.TCP) != 2 {
		t.Fatalf("db layer 4 %+v", db.Layer4)
	}
	got := Layer4Entries(m)
	want := map[string]string{
		"services.db.tcp[0]": "tcp/5432", "services.db.tcp[1]": "tcp/5433",
		"services.db.tls_passthrough": "tls passthrough db.example.com,xn--bcher-kva.example",
		"services.dns.tcp[0]":         "tcp/53", "services.dns.udp[0]": "udp/53", "services.web.udp[0]": "udp/5353",
	}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
}

// Every layer-4 rule refuses with its field path and a message naming
// what is wrong, and reports nothing else.
func TestLayer4Validation(t *testing.T) {
	cases := []struct {
		name, svcs string
		want       []string
	}{
		{"port zero", "web: {command: [x], tcp: [{port: 0}]}", []string{"services.web.tcp[0].port: must be between 1 and 65535"}},
		{"port too large", "web: {command: [x], udp: [{port: 65536}], readiness: {path: /}}", []string{"services.web.udp[0].port: must be between 1 and 65535"}},
		{"negative port", "web: {command: [x], tcp: [{port: -1}]}", []string{"services.web.tcp[0].port: must be between 1 and 65535"}},
		{"port not a number", "web: {command: [x], tcp: [{port: x}]}", []string{"(syntax):"}},
		{"unknown layer-4 field", "web: {command: [x], tcp: [{port: 1, proto: udp}]}", []string{"(syntax):", `field proto not found`}},
		{"tcp twice in a service", "web: {command: [x], tcp: [{port: 5432}, {port: 5432}]}", []string{"services.web.tcp[1].port: tcp/5432 is already at tcp[0]"}},
		{"udp twice in a service", "web: {command: [x], tcp: [{port: 53}], udp: [{port: 53}, {port: 53}]}", []string{"services.web.udp[1].port: udp/53 is already at udp[0]"}},
		{"one port, two services", "a: {command: [x], tcp: [{port: 5432}]}\n  b: {command: [x], tcp: [{port: 5432}]}", []string{"services.b.tcp[0].port: tcp/5432 is already exposed by service a"}},
		{"http", "web: {command: [x], tcp: [{port: 80}]}", []string{"services.web.tcp[0].port: tcp/80 is reserved: the gateway's HTTP port"}},
		{"https", "web: {command: [x], tcp: [{port: 443}]}", []string{"services.web.tcp[0].port: tcp/443 is reserved: the gateway's HTTPS port; route TLS to a service there with tls_passthrough"}},
		{"http/3", "web: {command: [x], tcp: [{port: 8443}], udp: [{port: 443}]}", []string{"services.web.udp[0].port: udp/443 is reserved: the gateway's HTTP/3 port"}},
		{"admin", "web: {command: [x], tcp: [{port: 2019}]}", []string{"services.web.tcp[0].port: tcp/2019 is reserved: Caddy's admin API"}},
		{"nats", "web: {command: [x], tcp: [{port: 4222}]}", []string{"services.web.tcp[0].port: tcp/4222 is reserved: the NATS client port"}},
		{"nats cluster", "web: {command: [x], tcp: [{port: 6222}]}", []string{"tcp/6222 is reserved: the NATS cluster port"}},
		{"nats leaf", "web: {command: [x], tcp: [{port: 7422}]}", []string{"tcp/7422 is reserved: the NATS leaf node port"}},
		{"nats monitor", "web: {command: [x], tcp: [{port: 8222}]}", []string{"tcp/8222 is reserved: the NATS monitoring port"}},
		{"mesh", "web: {command: [x], tcp: [{port: 1}], udp: [{port: 51820}]}", []string{"services.web.udp[0].port: udp/51820 is reserved: the mesh's WireGuard port"}},
		{"stun", "web: {command: [x], tcp: [{port: 1}], udp: [{port: 3478}]}", []string{"services.web.udp[0].port: udp/3478 is reserved: the control server's STUN port"}},
		{"passthrough host is an http host of the same service", "web: {command: [x], routes: [{hosts: [db.example.com]}], tls_passthrough: {hosts: [DB.example.com]}}",
			[]string{"services.web.tls_passthrough.hosts[0]: host db.example.com is an HTTP host of service web: the gateway either terminates TLS for a host or passes it through, not both"}},
		{"passthrough host is an http host of another service", "a: {command: [x], routes: [{hosts: [db.example.com]}]}\n  b: {command: [x], tls_passthrough: {hosts: [db.example.com]}}",
			[]string{"services.b.tls_passthrough.hosts[0]: host db.example.com is an HTTP host of service a"}},
		{"wildcard passthrough host", "web: {command: [x], tls_passthrough: {hosts: ['*.example.com']}}", []string{`services.web.tls_passthrough.hosts[0]: host "*.example.com": a passthrough host names one server; a wildcard is not allowed`}},
		{"passthrough host with a port", "web: {command: [x], tls_passthrough: {hosts: ['db.example.com:443']}}", []string{"services.web.tls_passthrough.hosts[0]: host \"db.example.com:443\": a host name only, without port"}},
		{"empty passthrough host", "web: {command: [x], tls_passthrough: {hosts: ['']}}", []string{"services.web.tls_passthrough.hosts[0]: empty host"}},
		{"passthrough without hosts", "web: {command: [x], tls_passthrough: {hosts: []}}", []string{"services.web.tls_passthrough.hosts: at least one host is required"}},
		{"passthrough host twice in a service", "web: {command: [x], tls_passthrough: {hosts: [db.example.com, DB.example.com.]}}", []string{"services.web.tls_passthrough.hosts[1]: host db.example.com is already at hosts[0]"}},
		{"passthrough host in two services", "a: {command: [x], tls_passthrough: {hosts: [db.example.com]}}\n  b: {command: [x], tls_passthrough: {hosts: [db.example.com]}}",
			[]string{"services.b.tls_passthrough.hosts[0]: host db.example.com is already passed through to service a"}},
		{"negative drain timeout", "web: {command: [x], tcp: [{port: 5432}], drain_timeout: -1s}", []string{"services.web.drain_timeout: must be between 0 (the default, 30s) and 1h0m0s"}},
		{"huge drain timeout", "web: {command: [x], tcp: [{port: 5432}], drain_timeout: 2h}", []string{"services.web.drain_timeout: must be between"}},
		{"udp only, never ready", "web: {command: [x], udp: [{port: 5353}]}", []string{"services.web.udp: a service reached only over UDP never becomes ready: readiness is a TCP connect to its PORT; set readiness.path"}},
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
}

// What the rules allow: UDP beside TCP, beside routes, or with a
// readiness path; the same port number over both protocols; a passthrough
// host beside other HTTP hosts; a wildcard HTTP host over a passthrough
// name (the passthrough takes that one name).
func TestLayer4Allowed(t *testing.T) {
	for _, svcs := range []string{
		"dns: {command: [x], tcp: [{port: 53}], udp: [{port: 53}]}",
		"dns: {command: [x], udp: [{port: 53}], readiness: {path: /healthz}}",
		"dns: {command: [x], udp: [{port: 53}], routes: [{hosts: [dns.example.com]}]}",
		"dns: {command: [x], udp: [{port: 53}], tls_passthrough: {hosts: [dns.example.com]}}",
		"db: {command: [x], tls_passthrough: {hosts: [db.example.com]}}\n  web: {command: [x], routes: [{hosts: ['*.example.com', web.example.com]}]}",
		"db: {command: [x], tcp: [{port: 5432}], drain_timeout: 1h}",
		"db: {command: [x], tcp: [{port: 65535}, {port: 1}]}",
	} {
		if _, err := Parse([]byte("namespace: a\nservices:\n  " + svcs + "\n")); err != nil {
			t.Errorf("%s: %v", svcs, err)
		}
	}
	// Every reserved port has a reason of its own.
	for _, k := range store.ReservedPorts {
		if reservedWhy(k) == reservedWhy(store.PortKey{Proto: "tcp", Port: 1}) {
			t.Errorf("reserved port %s has no reason of its own", k)
		}
	}
}
