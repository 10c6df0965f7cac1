package caddymodule

import (
	"encoding/json"
	"html"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Maintenance. A service under maintenance (projection.View.Maintenance:
// its own record, else its namespace's) is answered by the gateway
// itself, before any policy or instance: 503 with Retry-After, an HTML
// page with the operator's message (escaped) or, to a client that asks
// for JSON, {"error":"maintenance","message":...,"retry_after":N}. A
// route with a 503 error page answers that page instead, as it would for
// any 503 of the gateway's. Its instances are never asked, so taking it
// out of maintenance serves them again at once.

// defaultMaintenanceRetry is the Retry-After of a record that names none
// (control always names one).
const defaultMaintenanceRetry = time.Minute

// maintenanceMessage is the page's text when the operator gave none.
const maintenanceMessage = "This service is down for maintenance. Please try again later."

// serveMaintenance answers r for a service under maintenance rec; rt is
// the route r matched.
func serveMaintenance(w http.ResponseWriter, r *http.Request, rec store.MaintenanceRecord, rt *store.Route) error {
	retry := retryAfterSeconds(time.Duration(rec.RetryAfter))
	h := w.Header()
	h.Set("Retry-After", strconv.Itoa(retry))
	h.Set("Cache-Control", "no-store")
	h.Set("Edgeplane-Reason", "maintenance")
	if page, ok := rt.ErrorPages[http.StatusServiceUnavailable]; ok {
		return writeErrorPage(w, http.StatusServiceUnavailable, page)
	}
	msg := rec.Message
	if msg == "" {
		msg = maintenanceMessage
	}
	var body []byte
	if prefersJSON(r.Header.Get("Accept")) {
		h.Set("Content-Type", "application/json")
		body, _ = json.Marshal(struct {
			Error      string `json:"error"`
			Message    string `json:"message"`
			RetryAfter int    `json:"retry_after"`
		}{"maintenance", msg, retry})
		body = append(body, '\n')
	} else {
		h.Set("Content-Type", "text/html; charset=utf-8")
		body = maintenancePage(msg)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, err := w.Write(body)
	return err
}

// retryAfterSeconds is d as Retry-After's whole seconds, rounded up, at
// least 1; 0 is the default.
func retryAfterSeconds(d time.Duration) int {
	if d <= 0 {
		d = defaultMaintenanceRetry
	}
	return max(1, int(math.Ceil(d.Seconds())))
}

func maintenancePage(msg string) []byte {
	var b strings.Builder
	b.WriteString("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Down for maintenance</title></head>\n<body><h1>Down for maintenance</h1>\n<p>")
	b.WriteString(html.EscapeString(msg))
	b.WriteString("</p></body></html>\n")
	return []byte(b.String())
}

// prefersJSON reports whether an Accept header ranks JSON above HTML: a
// JSON type (application/json, or application/*+json) with a higher
// quality than text/html gets; "*/*" or no Accept at all is HTML, which a
// browser and a person with curl read.
func prefersJSON(accept string) bool {
	if accept == "" {
		return false
	}
	var qJSON, qHTML float64
	for _, part := range strings.Split(accept, ",") {
		mt, params, _ := strings.Cut(part, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
		q := 1.0
		for _, p := range strings.Split(params, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if ok && strings.EqualFold(k, "q") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					q = f
				}
			}
		}
		typ, sub, _ := strings.Cut(mt, "/")
		switch {
		case mt == "*/*":
			qJSON, qHTML = max(qJSON, q), max(qHTML, q)
		case typ == "application" && (sub == "json" || strings.HasSuffix(sub, "+json")):
			qJSON = max(qJSON, q)
		case mt == "text/html", mt == "text/*":
			qHTML = max(qHTML, q)
		}
	}
	return qJSON > qHTML
}
