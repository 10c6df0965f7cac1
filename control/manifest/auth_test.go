package manifest

import (
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// argon2Hash is a valid argon2id PHC string (Caddy's anti-timing hash).
const argon2Hash = "$argon2id$v=19$m=47104,t=1,p=1$P2nzckEdTZ3bxCiBCkRTyA$xQL3Z32eo5jKl7u5tcIsnEKObYiyNZQQf5/4sAau6Pg"

func bcryptHash(t *testing.T) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// A route's basic_auth and forward_auth parse, and what the rules allow
// passes: bcrypt or argon2id users, an auth URL or a service of the
// manifest, with uri, copy_headers and timeout.
func TestAuthAllowed(t *testing.T) {
	bc := bcryptHash(t)
	for _, route := range []string{
		"{hosts: [a.example], basic_auth: {users: [{username: alice, hash: '" + bc + "'}]}}",
		"{hosts: [a.example], basic_auth: {realm: staff only, users: [{username: alice, hash: '" + argon2Hash + "'}, {username: bob, hash: '" + argon2Hash + "'}]}}",
		"{hosts: [a.example], forward_auth: {url: 'http://auth.internal:9091', uri: '/api/verify?rd=x', copy_headers: [Remote-User, Remote-Email], timeout: 2s}}",
		"{hosts: [a.example], forward_auth: {url: 'https://auth.example/'}}",
		"{hosts: [a.example], forward_auth: {service: auth}}",
	} {
		m, err := Parse([]byte("namespace: a\nservices:\n  auth: {command: [x]}\n  web: {command: [x], routes: [" + route + "]}\n"))
		if err != nil {
			t.Errorf("%s: %v", route, err)
			continue
		}
		if r := m.Services["web"].Routes[0]; !r.HasProtection() {
			t.Errorf("%s: route has no protection after parsing: %+v", route, r)
		}
	}
}

// Every authentication rule refuses with its field path and a message
// naming what is wrong, and reports nothing else; a password in clear
// points at control hash-password.
func TestAuthValidation(t *testing.T) {
	bc := bcryptHash(t)
	user := func(name, hash string) string { return "{username: '" + name + "', hash: '" + hash + "'}" }
	const rp = "services.web.routes[0]"
	cases := []struct {
		name, route string
		want        string
	}{
		{"password in clear", "basic_auth: {users: [" + user("alice", "hunter2") + "]}",
			rp + ".basic_auth.users[0].hash: not a bcrypt or argon2id hash: a password in clear is never accepted; put its hash here (`control hash-password` prints one)"},
		{"sha hash", "basic_auth: {users: [" + user("alice", "{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=") + "]}", rp + ".basic_auth.users[0].hash: not a bcrypt or argon2id hash"},
		{"broken bcrypt", "basic_auth: {users: [" + user("alice", "$2a$10$short") + "]}", rp + ".basic_auth.users[0].hash: not a valid bcrypt hash"},
		{"broken argon2id", "basic_auth: {users: [" + user("alice", "$argon2id$v=19$m=1$x") + "]}", rp + ".basic_auth.users[0].hash: not a valid argon2id hash"},
		{"no users", "basic_auth: {users: []}", rp + ".basic_auth.users: at least one user is required"},
		{"empty username", "basic_auth: {users: [" + user("", bc) + "]}", rp + ".basic_auth.users[0].username: required"},
		{"colon in username", "basic_auth: {users: [" + user("a:b", bc) + "]}", rp + ".basic_auth.users[0].username: cannot hold ':'"},
		{"control character in username", "basic_auth: {users: [{username: \"a\\tb\", hash: '" + bc + "'}]}", rp + ".basic_auth.users[0].username: cannot hold control characters"},
		{"username twice", "basic_auth: {users: [" + user("alice", bc) + ", " + user("alice", bc) + "]}", rp + `.basic_auth.users[1].username: "alice" is already users[0]`},
		{"mixed algorithms", "basic_auth: {users: [" + user("alice", bc) + ", " + user("bob", argon2Hash) + "]}",
			rp + ".basic_auth.users[1].hash: a argon2id hash, but users[0] has a bcrypt one: the users of a route hash with one algorithm"},
		{"quote in realm", "basic_auth: {realm: 'a\"b', users: [" + user("alice", bc) + "]}", rp + ".basic_auth.realm: at most 128 printable characters"},
		{"long realm", "basic_auth: {realm: " + strings.Repeat("r", 129) + ", users: [" + user("alice", bc) + "]}", rp + ".basic_auth.realm: at most 128"},
		{"neither url nor service", "forward_auth: {uri: /verify}", rp + ".forward_auth: exactly one of url and service is required"},
		{"both url and service", "forward_auth: {url: 'http://a', service: auth}", rp + ".forward_auth: exactly one of url and service is required"},
		{"relative url", "forward_auth: {url: 'auth.internal:9091'}", rp + ".forward_auth.url: must be an absolute http:// or https:// URL"},
		{"other scheme", "forward_auth: {url: 'ftp://auth.internal'}", rp + ".forward_auth.url: must be an absolute http:// or https:// URL"},
		{"url with a path", "forward_auth: {url: 'http://auth.internal/verify'}", rp + ".forward_auth.url: the auth service's address only: put the path asked in uri"},
		{"url with credentials", "forward_auth: {url: 'http://u:p@auth.internal'}", rp + ".forward_auth.url: cannot hold credentials"},
		{"unknown service", "forward_auth: {service: nope}", rp + `.forward_auth.service: no service "nope" in this manifest`},
		{"uri without slash", "forward_auth: {service: auth, uri: verify}", rp + ".forward_auth.uri: must start with '/'"},
		{"bad copy header", "forward_auth: {service: auth, copy_headers: [Remote-User, 'Bad Header']}", rp + ".forward_auth.copy_headers[1]: not a valid header name"},
		{"negative timeout", "forward_auth: {service: auth, timeout: -1s}", rp + ".forward_auth.timeout: must be between 0 (the default, 5s) and 1m0s"},
		{"huge timeout", "forward_auth: {service: auth, timeout: 2m}", rp + ".forward_auth.timeout: must be between"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte("namespace: a\nservices:\n  auth: {command: [x]}\n  web: {command: [x], routes: [{hosts: [a.example], " + tc.route + "}]}\n"))
			if err == nil {
				t.Fatalf("accepted an invalid manifest: %+v", m)
			}
			me, ok := err.(*Error)
			if !ok {
				t.Fatalf("error type %T: %v", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if len(me.Problems) != 1 {
				t.Errorf("%d problems, want 1: %v", len(me.Problems), err)
			}
		})
	}
}
