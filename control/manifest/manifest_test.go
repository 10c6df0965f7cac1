package manifest

import (
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

const good = `
namespace: shop
services:
  web:
    command: ["hello", "--name", "web"]
    replicas: 2
    env: {GREETING: hi}
    readiness: {path: /healthz, timeout: 5s}
    routes:
      - hosts: ["Shop.Example.com.", "*.shop.example.com", "bücher.example"]
        path_prefixes: ["/"]
    placement: {regions: [eu], labels: {tier: edge}}
  api:
    command: ["hello"]
`

func TestParseGood(t *testing.T) {
	m, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	web := m.Services["web"]
	if web.ReplicaCount() != 2 || m.Services["api"].ReplicaCount() != 1 {
		t.Fatalf("replicas: %d %d", web.ReplicaCount(), m.Services["api"].ReplicaCount())
	}
	hosts := strings.Join(web.Routes[0].Hosts, ",")
	if hosts != "shop.example.com,*.shop.example.com,xn--bcher-kva.example" {
		t.Fatalf("hosts not normalised: %s", hosts)
	}
	if ReadinessTimeout(web).String() != "5s" || ReadinessTimeout(m.Services["api"]) != DefaultReadiness {
		t.Fatal("readiness timeout defaults")
	}
	// JSON is accepted too.
	if _, err := Parse([]byte(`{"namespace":"x","services":{"a":{"command":["a"]}}}`)); err != nil {
		t.Fatalf("json manifest: %v", err)
	}
}

// Every policy field parses and survives validation as written.
func TestParsePolicy(t *testing.T) {
	m, err := Parse([]byte(`
namespace: shop
services:
  api:
    command: [api]
    routes:
      - hosts: [shop.example.com]
        path_prefixes: [/api, /v1]
        redirect_https: true
        strip_prefix: true
        request_headers: {set: {X-Env: prod}, add: {X-Via: edge}, delete: [X-Debug]}
        response_headers: {set: {Strict-Transport-Security: max-age=31536000}, delete: [Server]}
        max_request_body: 10MB
        timeouts: {connect: 2s, response_header: 30s}
        retries: {on_status: [502, 503], max: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := m.Services["api"].Routes[0]
	if !r.RedirectHTTPS || !r.StripPrefix || r.RequestHeaders.Set["X-Env"] != "prod" || r.ResponseHeaders.Delete[0] != "Server" ||
		r.MaxRequestBody != "10MB" || r.Timeouts.ResponseHeader.String() != "30s" || r.Retries.Max != 2 || !r.HasPolicy() {
		t.Fatalf("policy: %+v", r)
	}
	if n, err := store.ParseByteSize(r.MaxRequestBody); err != nil || n != 10<<20 {
		t.Fatalf("10MB is %d (%v)", n, err)
	}
	// Policy is how traffic reaches instances, not what they run.
	plain := m.Services["api"]
	plain.Routes = nil
	if SpecHash(plain) != SpecHash(m.Services["api"]) {
		t.Fatal("a route policy changed the spec hash: instances would restart for it")
	}
}

func TestSpecHashStable(t *testing.T) {
	a, _ := Parse([]byte(good))
	b, _ := Parse([]byte(good))
	if SpecHash(a.Services["web"]) != SpecHash(b.Services["web"]) || Hash(a) != Hash(b) {
		t.Fatal("hash differs for the same manifest")
	}
	if SpecHash(a.Services["web"]) == SpecHash(a.Services["api"]) {
		t.Fatal("different specs share a hash")
	}
}

// Every validation rule, each with the field path it must report.
func TestValidationErrors(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"empty", ``, []string{"(file): empty manifest"}},
		{"syntax", "namespace: [", []string{"(syntax):"}},
		{"unknown field", "namespace: a\nservices: {}\nbogus: 1", []string{"(syntax):", "bogus"}},
		{"two documents", "namespace: a\nservices: {}\n---\nnamespace: b\nservices: {}", []string{"(file): more than one document"}},
		{"missing namespace", "services: {}", []string{"namespace: required"}},
		{"bad namespace", "namespace: Shop_1\nservices: {}", []string{"namespace: must be a DNS label"}},
		{"missing services", "namespace: a", []string{"services: required"}},
		{"bad service name", "namespace: a\nservices: {Web: {command: [x]}}", []string{"services.Web: service name must be a DNS label"}},
		{"no command", "namespace: a\nservices: {web: {}}", []string{"services.web.command: required"}},
		{"blank command", "namespace: a\nservices: {web: {command: [' ']}}", []string{"services.web.command: required"}},
		{"negative replicas", "namespace: a\nservices: {web: {command: [x], replicas: -1}}", []string{"services.web.replicas: must be >= 0"}},
		{"too many replicas", "namespace: a\nservices: {web: {command: [x], replicas: 5000}}", []string{"services.web.replicas: must be <= 1000"}},
		{"bad port", "namespace: a\nservices: {web: {command: [x], port: 70000}}", []string{"services.web.port: must be between"}},
		{"bad env", "namespace: a\nservices: {web: {command: [x], env: {1X: y}}}", []string{"services.web.env.1X: not a valid"}},
		{"reserved env", "namespace: a\nservices: {web: {command: [x], env: {PORT: '1'}}}", []string{"services.web.env.PORT: reserved"}},
		{"readiness path", "namespace: a\nservices: {web: {command: [x], readiness: {path: healthz}}}", []string{"services.web.readiness.path: must start with '/'"}},
		{"readiness timeout", "namespace: a\nservices: {web: {command: [x], readiness: {timeout: 1h}}}", []string{"services.web.readiness.timeout: must be between"}},
		{"bad duration", "namespace: a\nservices: {web: {command: [x], readiness: {timeout: soon}}}", []string{"(syntax):", "soon"}},
		{"route without hosts", "namespace: a\nservices: {web: {command: [x], routes: [{path_prefixes: [/]}]}}", []string{"services.web.routes[0].hosts: at least one"}},
		{"host with port", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: ['a.com:80']}]}}", []string{"services.web.routes[0].hosts[0]: host \"a.com:80\""}},
		{"inner wildcard", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: ['a.*.com']}]}}", []string{"services.web.routes[0].hosts[0]: host \"a.*.com\": only a leading"}},
		{"empty host", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: ['']}]}}", []string{"services.web.routes[0].hosts[0]: empty host"}},
		{"bad prefix", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], path_prefixes: [api]}]}}", []string{"services.web.routes[0].path_prefixes[0]: must start with '/'"}},
		{"duplicate route", "namespace: a\nservices: {api: {command: [x], routes: [{hosts: [a.com]}]}, web: {command: [x], routes: [{hosts: [A.com.]}]}}", []string{"services.web.routes[0]: host a.com path / is already routed to service api"}},
		{"bad region", "namespace: a\nservices: {web: {command: [x], placement: {regions: [EU_1]}}}", []string{"services.web.placement.regions: region \"EU_1\""}},
		{"bad label key", "namespace: a\nservices: {web: {command: [x], placement: {labels: {'-x': y}}}}", []string{"services.web.placement.labels.-x: not a valid label key"}},
		{"many at once", "namespace: A\nservices: {web: {replicas: -2}}", []string{"namespace: must be", "services.web.command: required", "services.web.replicas: must be >= 0"}},
		{"bad restart", "namespace: a\nservices: {web: {command: [x], restart: sometimes}}", []string{"services.web.restart: must be always, on-failure or never"}},
		{"bad image", "namespace: a\nservices: {web: {image: 'Hello World'}}", []string{"services.web.image: not an image reference"}},
		{"short digest", "namespace: a\nservices: {web: {image: 'hello@sha256:abc'}}", []string{"services.web.image: not an image reference"}},
		{"limits without image", "namespace: a\nservices: {web: {command: [x], read_only: true}}", []string{"services.web: read_only and resources apply to images only"}},
		{"bad memory", "namespace: a\nservices: {web: {image: hello, resources: {memory: lots}}}", []string{"services.web.resources.memory: memory \"lots\""}},
		{"negative cpus", "namespace: a\nservices: {web: {image: hello, resources: {cpus: -1}}}", []string{"services.web.resources.cpus: must be >= 0"}},
		{"strip without a prefix", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], strip_prefix: true}]}}", []string{"services.web.routes[0].strip_prefix: needs a path prefix other than /"}},
		{"bad header name", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], request_headers: {set: {'X A': b}}}]}}", []string{"services.web.routes[0].request_headers.set.X A: not a valid header name"}},
		{"hop-by-hop header", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], response_headers: {add: {connection: close}}}]}}", []string{"services.web.routes[0].response_headers.add.connection: a connection header"}},
		{"header value line break", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], request_headers: {set: {X-A: \"b\\r\\nX-Evil: 1\"}}}]}}", []string{"services.web.routes[0].request_headers.set.X-A: a header value cannot hold a line break"}},
		{"bad header delete", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], response_headers: {delete: ['bad header']}}]}}", []string{"services.web.routes[0].response_headers.delete[0]: not a valid header name"}},
		{"bad body size", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], max_request_body: lots}]}}", []string{"services.web.routes[0].max_request_body: size \"lots\""}},
		{"negative timeout", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], timeouts: {connect: -1s, response_header: 2h}}]}}", []string{"services.web.routes[0].timeouts.connect: must be between", "services.web.routes[0].timeouts.response_header: must be between"}},
		{"retries without statuses", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], retries: {max: 2}}]}}", []string{"services.web.routes[0].retries.on_status: at least one"}},
		{"retry on a success", "namespace: a\nservices: {web: {command: [x], routes: [{hosts: [a.com], retries: {on_status: [200, 503], max: 9}}]}}", []string{"services.web.routes[0].retries.on_status[0]: must be an error status", "services.web.routes[0].retries.max: must be between 1 and 5"}},
		{"rollout without steps", "namespace: a\nservices: {}\nrollout: {steps: []}", []string{"rollout.steps: at least one step"}},
		{"rollout weight", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 101, hold: 10s}]}", []string{"rollout.steps[0].weight: must be a percentage"}},
		{"rollout hold", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10}]}", []string{"rollout.steps[0].hold: must be a duration"}},
		{"rollout sticky down", "namespace: a\nservices: {}\nrollout: {sticky: true, steps: [{weight: 50, hold: 1s}, {weight: 10, hold: 1s}]}", []string{"rollout.steps[1].weight: with sticky, weights may not go down"}},
		{"rollout 5xx ratio", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], limits: {max_5xx_ratio: 5}}", []string{"rollout.limits.max_5xx_ratio: must be a fraction"}},
		{"rollout p99 ratio", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], limits: {max_p99_ratio: 0.5}}", []string{"rollout.limits.max_p99_ratio: must be at least 1"}},
		{"rollout min requests", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], limits: {min_requests: -1}}", []string{"rollout.limits.min_requests: must be >= 0"}},
		{"rollout match both", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], match: {header: X-A, cookie: b, value: c}}", []string{"rollout.match: exactly one of header and cookie"}},
		{"rollout match header", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], match: {header: 'X A', value: c}}", []string{"rollout.match.header: not a valid header name"}},
		{"rollout match value", "namespace: a\nservices: {}\nrollout: {steps: [{weight: 10, hold: 1s}], match: {cookie: tester}}", []string{"rollout.match.value: required"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("accepted an invalid manifest")
			}
			me, ok := err.(*Error)
			if !ok {
				t.Fatalf("error type %T: %v", err, err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if se := me.Structured(); se.Code != "invalid" || len(se.Detail) == 0 {
				t.Errorf("structured form: %+v", se)
			}
		})
	}
}

func TestTooLarge(t *testing.T) {
	big := make([]byte, MaxSize+1)
	if _, err := Parse(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"namespace":"x","services":{"a":{"command":["a"],"routes":[{"hosts":["*.a"]}]}}}`))
	f.Add([]byte("namespace: a\nservices: {web: {replicas: -2}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err == nil && m == nil {
			t.Fatal("nil manifest without an error")
		}
		if err != nil && err.Error() == "" {
			t.Fatal("empty error text")
		}
	})
}

func TestImageServices(t *testing.T) {
	for _, doc := range []string{
		"namespace: a\nservices: {web: {image: registry.example.com:5000/team/hello:v1.2}}",
		"namespace: a\nservices: {web: {image: 'hello@sha256:" + strings.Repeat("ab", 32) + "', command: [/hello, -v]}}",
		"namespace: a\nservices: {web: {image: hello, read_only: true, resources: {cpus: 0.5, memory: 64Mi}}}",
	} {
		if _, err := Parse([]byte(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
	for in, want := range map[string]int64{"64Mi": 64 << 20, "1G": 1 << 30, "512k": 512 << 10, "1048576": 1 << 20, "2MiB": 2 << 20} {
		if got, err := MemoryBytes(in); err != nil || got != want {
			t.Errorf("MemoryBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	// The example manifests of the repository are valid.
	for _, f := range []string{"../../examples/hello.yaml", "../../examples/hello-image.yaml"} {
		if _, err := ReadFile(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The replica count and the routes are not what an instance runs: changing
// them keeps the hash; changing anything an instance sees does not.
func TestSpecHashIgnoresReplicasAndRoutes(t *testing.T) {
	one, three := 1, 3
	base := store.ServiceSpec{Command: []string{"app"}, Replicas: &one, Env: map[string]string{"A": "1"},
		Routes: []store.Route{{Hosts: []string{"a.example.com"}}}}
	h := SpecHash(base)
	same := base
	same.Replicas = &three
	same.Routes = []store.Route{{Hosts: []string{"a.example.com", "b.example.com"}, PathPrefixes: []string{"/api"}}}
	if SpecHash(same) != h {
		t.Error("scaling or routing changed the spec hash")
	}
	for name, change := range map[string]func(*store.ServiceSpec){
		"command":   func(s *store.ServiceSpec) { s.Command = []string{"app", "-v"} },
		"env":       func(s *store.ServiceSpec) { s.Env = map[string]string{"A": "2"} },
		"port":      func(s *store.ServiceSpec) { s.Port = 8080 },
		"readiness": func(s *store.ServiceSpec) { s.Readiness.Path = "/ready" },
		"restart":   func(s *store.ServiceSpec) { s.Restart = store.RestartNever },
		"image_id":  func(s *store.ServiceSpec) { s.ImageID = "sha256:00" },
		"placement": func(s *store.ServiceSpec) { s.Placement.Regions = []string{"eu"} },
	} {
		s := base
		change(&s)
		if SpecHash(s) == h {
			t.Errorf("changing %s kept the spec hash", name)
		}
	}
}
