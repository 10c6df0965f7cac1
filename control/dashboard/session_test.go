package dashboard

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/internal/netnstest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// serve runs d on addr through Serve, as `control server` does, until the
// test ends, and returns its base URL (no trailing slash).
func serve(t *testing.T, addr string, d *Server) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	u, wait, err := Serve(ctx, addr, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); wait() })
	return strings.TrimSuffix(u, "/")
}

// do sends one request to base+path with hdr (Host among them), not
// following redirects.
func do(t *testing.T, method, base, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return resp, b.String()
}

// newToken stores a dashboard token and returns it.
func newToken(t *testing.T, s *store.Store) (string, *store.DashboardToken) {
	t.Helper()
	tok, rec, err := NewToken("ops")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutDashboardToken(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return tok, rec
}

// login logs in with tok and returns the session cookie.
func login(t *testing.T, base, tok string, hdr map[string]string) *http.Cookie {
	t.Helper()
	resp, body := do(t, "POST", base, "/login", url.Values{"token": {tok}}, hdr)
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("login: %d %v %.200s", resp.StatusCode, resp.Cookies(), body)
	}
	return resp.Cookies()[0]
}

// The open loopback dashboard answers only requests naming it by a
// loopback Host: a page that rebinds its own name to 127.0.0.1 gets a
// refusal saying why, never a page.
func TestLoopbackDashboardRefusesOtherHosts(t *testing.T) {
	s := storetest.Start(t).Store
	d, err := New(s, Config{DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, "127.0.0.1:0", d)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	for _, host := range []string{"attacker.example", "attacker.example:" + port, "127.0.0.1.nip.io:" + port, "localhost.attacker.example", "10.0.0.1:" + port} {
		for _, path := range []string{"/", "/events", "/machines", "/static/app.js", "/login"} {
			resp, body := do(t, "GET", base, path, nil, map[string]string{"Host": host})
			if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(body, "answers to localhost, 127.0.0.1 or [::1] only") {
				t.Fatalf("Host %s %s: %d %.200s", host, path, resp.StatusCode, body)
			}
			if strings.Contains(body, `id="main"`) {
				t.Fatalf("Host %s %s: a page was served", host, path)
			}
		}
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "LOCALHOST", "[::1]:" + port, "127.0.0.1"} {
		if resp, body := do(t, "GET", base, "/", nil, map[string]string{"Host": host}); resp.StatusCode != http.StatusOK {
			t.Errorf("Host %s: %d %.200s", host, resp.StatusCode, body)
		}
	}
}

// A login exchanges the token for a session: the cookie is a random ID,
// not the token nor its secret; the store keeps the session under the
// ID's hash; the session works on every dashboard of the store (another
// one, or this one restarted); it ends at logout and at its expiry.
func TestDashboardSessions(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	d, err := New(s, Config{RequireLogin: true, DoctorEvery: -1, SessionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, "127.0.0.1:0", d)
	tok, _ := newToken(t, s)
	_, secret, _ := ParseToken(tok)
	loggedIn := time.Now()
	c := login(t, base, tok, nil)
	if c.Value == tok || strings.Contains(c.Value, secret) || strings.Contains(tok, c.Value) {
		t.Fatalf("the cookie carries the token: %q", c.Value)
	}
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge != 2 {
		t.Errorf("cookie %+v", c)
	}
	if _, err := storetest.Bucket(t, s, s.Names.DashboardSessionsBucket()).Get(ctx, c.Value); err == nil {
		t.Error("the store keeps the session under its cookie's value")
	}
	if _, err := storetest.Bucket(t, s, s.Names.DashboardSessionsBucket()).Get(ctx, sessionKey(c.Value)); err != nil {
		t.Errorf("the session is not in the store: %v", err)
	}
	cookie := map[string]string{"Cookie": c.Name + "=" + c.Value}
	// The token itself as a cookie is no session.
	if resp, _ := do(t, "GET", base, "/", nil, map[string]string{"Cookie": c.Name + "=" + tok}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("the token as a cookie: %d", resp.StatusCode)
	}
	// Another dashboard on the same store (or this one after a restart)
	// knows the session.
	d2, err := New(s, Config{RequireLogin: true, DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	base2 := serve(t, "127.0.0.1:0", d2)
	for _, b := range []string{base, base2} {
		if resp, body := do(t, "GET", b, "/", nil, cookie); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s with the session: %d %.200s", b, resp.StatusCode, body)
		}
	}
	// Expired, it is refused everywhere.
	storetest.Eventually(t, 10*time.Second, "the session to expire", func() bool {
		resp, _ := do(t, "GET", base2, "/", nil, cookie)
		return resp.StatusCode == http.StatusSeeOther
	})
	if took := time.Since(loggedIn); took < 2*time.Second {
		t.Errorf("the session ended %s after the login, before its TTL", took)
	}
	if resp, _ := do(t, "GET", base, "/events", nil, cookie); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("events with an expired session: %d", resp.StatusCode)
	}
	// A logout ends a session on every dashboard.
	c = login(t, base, tok, nil)
	cookie = map[string]string{"Cookie": c.Name + "=" + c.Value}
	if resp, _ := do(t, "POST", base2, "/logout", nil, cookie); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "GET", base, "/", nil, cookie); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a session after its logout: %d", resp.StatusCode)
	}
}

// An open event stream checks its session again every SessionRecheck:
// when its token is revoked it ends within that, saying so.
func TestRevokedTokenEndsOpenEventStream(t *testing.T) {
	s := storetest.Start(t).Store
	const recheck = 300 * time.Millisecond
	d, err := New(s, Config{RequireLogin: true, DoctorEvery: -1, SessionRecheck: recheck})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	base := serve(t, "127.0.0.1:0", d)
	tok, rec := newToken(t, s)
	c := login(t, base, tok, nil)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/events", nil)
	req.AddCookie(c)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// The stream lives across several rechecks while the token is good.
	live := time.After(3 * recheck)
	for waiting := true; waiting; {
		select {
		case _, ok := <-lines:
			if !ok {
				t.Fatal("the stream of a good session ended")
			}
		case <-live:
			waiting = false
		}
	}
	if err := s.DeleteDashboardToken(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	sawLogout := false
	timeout := time.After(recheck + 5*time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				took := time.Since(revoked)
				if !sawLogout {
					t.Error("the stream ended without its logout event")
				}
				// Within the recheck interval, with room for a slow box.
				if took > recheck+2*time.Second {
					t.Errorf("the stream ended %s after the revocation; recheck %s", took, recheck)
				}
				t.Logf("stream ended %s after the revocation (recheck %s)", took.Round(time.Millisecond), recheck)
				return
			}
			if l == "event: logout" {
				sawLogout = true
			}
		case <-timeout:
			t.Fatal("a revoked token's event stream is still open")
		}
	}
}

// The session cookie is Secure unless the browser talks to the dashboard
// on loopback directly: behind a loopback listener reached under another
// name (a TLS proxy on the box) and on a listener that is not loopback.
func TestSessionCookieSecureOffLoopback(t *testing.T) {
	s := storetest.Start(t).Store
	tok, _ := newToken(t, s)
	d, err := New(s, Config{RequireLogin: true, DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, "127.0.0.1:0", d)
	if c := login(t, base, tok, nil); c.Secure {
		t.Error("a loopback login's cookie is Secure: the browser could not send it back over http://127.0.0.1")
	}
	if c := login(t, base, tok, map[string]string{"Host": "dash.example.com"}); !c.Secure {
		t.Error("behind a proxy (Host dash.example.com), the cookie is not Secure")
	}
	if !netnstest.Available() {
		t.Log("not root: no listener off loopback tried")
		return
	}
	addr := netnstest.NonLoopbackAddr(t, "epd", 232)
	off := serve(t, net.JoinHostPort(addr, "0"), d)
	if c := login(t, off, tok, nil); !c.Secure {
		t.Errorf("on %s, the cookie is not Secure", off)
	}
}
