package dashboard

import (
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// sessionCookie holds the session a browser logged in to: a random ID the
// store knows (store.DashboardSession), never the token it was opened
// with.
const sessionCookie = "edgeplane_dashboard"

// DefaultSessionTTL is how long a login lasts; the token itself lasts
// until revoked.
const DefaultSessionTTL = 12 * time.Hour

// DefaultSessionRecheck is how often an open event stream checks its
// session again: a revoked token's or an expired session's stream ends
// within it.
const DefaultSessionRecheck = 10 * time.Second

// session returns the session the request's cookie names, checked against
// the store now (its expiry, and its token not revoked).
func (d *Server) session(r *http.Request) (*store.DashboardSession, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, store.Errorf(store.CodeUnauthorized, "not logged in")
	}
	return checkSession(r.Context(), d.s, c.Value)
}

type loginData struct {
	pageData
	Error string
}

func (d *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, "login", http.StatusOK, &loginData{pageData: pageData{Title: "log in", Scope: "none", At: time.Now()}})
}

// login checks a token and opens a session for it, whose ID the cookie
// keeps.
func (d *Server) login(w http.ResponseWriter, r *http.Request) {
	// A login posted from another site is refused: it would log the
	// browser in as someone else.
	if !sameOrigin(r) {
		http.Error(w, "cross-site login refused", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	tok := r.PostFormValue("token")
	rec, err := CheckToken(r.Context(), d.s, tok)
	var id string
	if err == nil {
		id, _, err = openSession(r.Context(), d.s, rec, d.cfg.SessionTTL)
	}
	if err != nil {
		status := http.StatusUnauthorized
		msg := "unknown or revoked token"
		if !store.HasCode(err, store.CodeUnauthorized) {
			status, msg = http.StatusServiceUnavailable, "the store could not be read; try again"
			d.log.Warn("dashboard login", zap.Error(err))
		}
		d.render(w, r, "login", status, &loginData{pageData: pageData{Title: "log in", Scope: "none", At: time.Now()}, Error: msg})
		return
	}
	d.log.Info("dashboard login", zap.String("token", rec.ID), zap.String("name", rec.Name), zap.String("remote", r.RemoteAddr),
		zap.Duration("session_ttl", d.cfg.SessionTTL))
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", MaxAge: int(d.cfg.SessionTTL / time.Second),
		HttpOnly: true, Secure: secureCookie(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (d *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil && sameOrigin(r) {
		if err := endSession(r.Context(), d.s, c.Value); err != nil {
			d.log.Warn("dashboard logout", zap.Error(err))
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: secureCookie(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// secureCookie says whether the session cookie is marked Secure: always,
// unless the browser talks to the dashboard on loopback directly (a
// loopback address, named by a loopback Host), the one place plain HTTP
// does not cross a network. Behind a TLS proxy the request reaching the
// dashboard is plain HTTP, but the browser's is not: the cookie must
// never go back over plain HTTP.
func secureCookie(r *http.Request) bool {
	return r.TLS != nil || !(loopbackHost(r.Host) && loopbackConn(r))
}

// loopbackConn reports whether r came in on a loopback address.
func loopbackConn(r *http.Request) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackHost reports whether a Host header names this box's loopback:
// localhost or a loopback address, with or without a port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sameOrigin reports whether r comes from the dashboard's own pages (or
// from no page at all, as a CLI's request does): browsers say where a
// request comes from in Sec-Fetch-Site, and older ones in Origin.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && u.Host == r.Host
	}
	return true
}
