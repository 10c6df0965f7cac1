package dashboard

import (
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// sessionCookie holds the token a browser logged in with.
const sessionCookie = "edgeplane_dashboard"

// sessionTTL is how long a login lasts in the browser; the token itself
// lasts until revoked.
const sessionTTL = 12 * time.Hour

// session returns the token the request's cookie names, checked against
// the store now.
func (d *Server) session(r *http.Request) (*store.DashboardToken, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, store.Errorf(store.CodeUnauthorized, "not logged in")
	}
	return d.s.CheckDashboardToken(r.Context(), c.Value)
}

type loginData struct {
	pageData
	Error string
}

func (d *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, "login", http.StatusOK, &loginData{pageData: pageData{Title: "log in", Scope: "none", At: time.Now()}})
}

// login checks a token and keeps it in the session cookie.
func (d *Server) login(w http.ResponseWriter, r *http.Request) {
	// A login posted from another site is refused: it would log the
	// browser in as someone else.
	if !sameOrigin(r) {
		http.Error(w, "cross-site login refused", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	tok := r.PostFormValue("token")
	rec, err := d.s.CheckDashboardToken(r.Context(), tok)
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
	d.log.Info("dashboard login", zap.String("token", rec.ID), zap.String("name", rec.Name), zap.String("remote", r.RemoteAddr))
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: tok, Path: "/", MaxAge: int(sessionTTL / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (d *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
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
