package caddymodule

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// testBcrypt hashes pw at bcrypt's lowest cost, to keep tests fast.
func testBcrypt(t testing.TB, pw string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// testArgon2id hashes pw as a PHC string Caddy's argon2id reads, with
// small parameters.
func testArgon2id(t testing.TB, pw string) string {
	t.Helper()
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	key := argon2.IDKey([]byte(pw), salt, 1, 1024, 1, 32)
	return fmt.Sprintf("$argon2id$v=%d$m=1024,t=1,p=1$%s$%s", argon2.Version,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key))
}

// headerBackend answers with the request headers the auth tests look at.
func headerBackend(t testing.TB) storetest.Instance {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "method=%s path=%s user=%s email=%s body=%s", r.Method, r.URL.Path, r.Header.Get("Remote-User"), r.Header.Get("Remote-Email"), body)
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: "app1", Machine: "m1", Address: host, Port: port}
}

// authService is an identity proxy: token "alice" is let through with
// Remote-User (and no Remote-Email), "login" is redirected to a login
// page, anything else is refused 401. It notes what it was asked.
type authService struct {
	srv   *httptest.Server
	asked atomic.Value // string: method, X-Forwarded-Method, -Uri, path
}

func newAuthService(t testing.TB) *authService {
	t.Helper()
	a := &authService{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.asked.Store(fmt.Sprintf("%s %s %s %s", r.Method, r.Header.Get("X-Forwarded-Method"), r.Header.Get("X-Forwarded-Uri"), r.URL.RequestURI()))
		switch r.Header.Get("X-Token") {
		case "alice":
			w.Header().Set("Remote-User", "alice")
			w.WriteHeader(http.StatusNoContent)
		case "login":
			w.Header().Set("Location", "https://login.example/?rd="+r.Header.Get("X-Forwarded-Uri"))
			w.WriteHeader(http.StatusFound)
		default:
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, "denied by auth")
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *authService) instance() storetest.Instance {
	host, portStr, _ := net.SplitHostPort(a.srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: "auth1", Machine: "m1", Address: host, Port: port}
}

// authDo sends a request through the gateway, redirects not followed.
func authDo(t *testing.T, f *fixture, method, host, path string, header http.Header, user, pw string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+f.gateway+path, strings.NewReader(map[bool]string{true: "payload"}[method == http.MethodPost]))
	req.Host = host
	for k, v := range header {
		req.Header[k] = v
	}
	if user != "" {
		req.SetBasicAuth(user, pw)
	}
	// An unknown user is checked against Caddy's dummy hash, a bcrypt at
	// cost 14: about a second here, many under the race detector.
	client := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// basic_auth through a real gateway: right credentials pass (bcrypt and
// argon2id), a wrong password, an unknown user and no credentials are
// refused 401 with the route's realm in the challenge (the default
// realm when the route sets none); a route without auth is untouched.
func TestBasicAuthThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	in := headerBackend(t)
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{in},
		Routes: []store.Route{
			{Hosts: []string{"bcrypt.example"}, BasicAuth: &store.BasicAuth{Realm: "staff only", Users: []store.BasicAuthUser{
				{Username: "alice", Hash: testBcrypt(t, "wonderland")}, {Username: "bob", Hash: testBcrypt(t, "builder")}}}},
			{Hosts: []string{"argon.example"}, BasicAuth: &store.BasicAuth{Users: []store.BasicAuthUser{
				{Username: "carol", Hash: testArgon2id(t, "correct horse")}}}},
			{Hosts: []string{"open.example"}},
		},
	}}))
	cases := []struct {
		name, host, user, pw string
		want                 int
		realm                string
	}{
		{"bcrypt right", "bcrypt.example", "alice", "wonderland", 200, ""},
		{"bcrypt second user", "bcrypt.example", "bob", "builder", 200, ""},
		{"bcrypt right again (cached)", "bcrypt.example", "alice", "wonderland", 200, ""},
		{"bcrypt wrong password", "bcrypt.example", "alice", "builder", 401, `Basic realm="staff only"`},
		{"bcrypt unknown user", "bcrypt.example", "mallory", "wonderland", 401, `Basic realm="staff only"`},
		{"bcrypt no credentials", "bcrypt.example", "", "", 401, `Basic realm="staff only"`},
		{"argon2id right", "argon.example", "carol", "correct horse", 200, ""},
		{"argon2id wrong", "argon.example", "carol", "correct horse!", 401, `Basic realm="restricted"`},
		{"argon2id no credentials", "argon.example", "", "", 401, `Basic realm="restricted"`},
		{"no auth route", "open.example", "", "", 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := authDo(t, f, "GET", tc.host, "/x", nil, tc.user, tc.pw)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d (%q)", resp.StatusCode, tc.want, body)
			}
			if got := resp.Header.Get("Www-Authenticate"); got != tc.realm {
				t.Fatalf("challenge %q, want %q", got, tc.realm)
			}
			if tc.want == 200 && !strings.HasPrefix(body, "method=GET path=/x") {
				t.Fatalf("backend answer %q", body)
			}
			if tc.want == 401 && strings.Contains(body, "method=") {
				t.Fatalf("a refused request reached the backend: %q", body)
			}
		})
	}
}

// forward_auth through a real gateway, the auth service named by URL and
// as a service of the namespace: a 2xx answer lets the request through
// (body and method kept) with its Remote-User copied and a client's own
// Remote-Email dropped; the auth's 401 and 302 reach the client as they
// are; the auth service asked with GET, the uri and X-Forwarded-Method
// and -Uri; an auth service that cannot be reached, or a service with no
// instance, is a 503 and the backend is never asked.
func TestForwardAuthThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	in := headerBackend(t)
	auth := newAuthService(t)
	fwd := func(fa store.ForwardAuth) *store.ForwardAuth {
		fa.CopyHeaders = []string{"Remote-User", "remote-email"}
		return &fa
	}
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"auth":  {Instances: []storetest.Instance{auth.instance()}},
		"empty": {},
		"web": {
			Instances: []storetest.Instance{in},
			Routes: []store.Route{
				{Hosts: []string{"url.example"}, ForwardAuth: fwd(store.ForwardAuth{URL: auth.srv.URL, URI: "/api/verify?rd=1"})},
				{Hosts: []string{"svc.example"}, ForwardAuth: fwd(store.ForwardAuth{Service: "auth"})},
				{Hosts: []string{"down.example"}, ForwardAuth: fwd(store.ForwardAuth{URL: "http://" + freeAddr(t), Timeout: store.Duration(time.Second)})},
				{Hosts: []string{"noinst.example"}, ForwardAuth: fwd(store.ForwardAuth{Service: "empty"})},
			},
		},
	}))
	for _, host := range []string{"url.example", "svc.example"} {
		t.Run(host, func(t *testing.T) {
			resp, body := authDo(t, f, "POST", host, "/orders?id=7", http.Header{"X-Token": {"alice"}, "Remote-Email": {"spoof@example"}}, "", "")
			if resp.StatusCode != 200 || body != "method=POST path=/orders user=alice email= body=payload" {
				t.Fatalf("allowed: %d %q", resp.StatusCode, body)
			}
			wantURI := "/?id=7" // a uri without a query keeps the request's, as Caddy's rewrite does
			if host == "url.example" {
				wantURI = "/api/verify?rd=1"
			}
			if got, want := auth.asked.Load(), "GET POST /orders?id=7 "+wantURI; got != want {
				t.Fatalf("auth asked %q, want %q", got, want)
			}
			resp, body = authDo(t, f, "GET", host, "/x", http.Header{"X-Token": {"eve"}}, "", "")
			if resp.StatusCode != 401 || body != "denied by auth" {
				t.Fatalf("denied: %d %q", resp.StatusCode, body)
			}
			resp, _ = authDo(t, f, "GET", host, "/account", http.Header{"X-Token": {"login"}}, "", "")
			if resp.StatusCode != 302 || resp.Header.Get("Location") != "https://login.example/?rd=/account" {
				t.Fatalf("redirected: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
			}
		})
	}
	for _, host := range []string{"down.example", "noinst.example"} {
		t.Run(host, func(t *testing.T) {
			resp, body := authDo(t, f, "GET", host, "/x", http.Header{"X-Token": {"alice"}}, "", "")
			if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, "method=") {
				t.Fatalf("auth service down: %d %q, want 503 without the backend", resp.StatusCode, body)
			}
		})
	}
}
