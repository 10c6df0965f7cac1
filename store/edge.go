package store

import (
	"strings"
	"time"
)

// Edge protection: what a route asks of the gateway before (and around)
// proxying: who may reach it (basic_auth, forward_auth, allow/deny), how
// fast (rate_limit, fleet-wide), what its errors look like (error_pages),
// and what is logged of it (access_log). A namespace or service under
// maintenance is a routing event (MaintenanceRecord), so every gateway
// answers its 503 page with the routing change that carries it.

// BasicAuth asks for HTTP basic credentials (Caddy's http_basic
// authentication provider). A user's Hash is a bcrypt ("$2a$", "$2b$",
// "$2y$") or argon2id ("$argon2id$") hash, never a password: `control
// hash-password` prints one.
type BasicAuth struct {
	// Realm is the realm the challenge names; default "restricted".
	Realm string          `json:"realm,omitempty" yaml:"realm,omitempty"`
	Users []BasicAuthUser `json:"users" yaml:"users"`
}

// BasicAuthUser is one user of a BasicAuth.
type BasicAuthUser struct {
	Username string `json:"username" yaml:"username"`
	Hash     string `json:"hash" yaml:"hash"`
}

// PasswordHashKind says which hash a BasicAuthUser's Hash is ("bcrypt",
// "argon2id"), "" when it is none of them (a password in clear).
func PasswordHashKind(hash string) string {
	switch {
	case strings.HasPrefix(hash, "$2a$"), strings.HasPrefix(hash, "$2b$"), strings.HasPrefix(hash, "$2y$"):
		return "bcrypt"
	case strings.HasPrefix(hash, "$argon2id$"):
		return "argon2id"
	}
	return ""
}

// ForwardAuth asks an auth service before proxying (Caddy's
// forward_auth): a 2xx answer lets the request through with CopyHeaders
// copied from the answer onto it; any other answer is the client's; an
// auth service that cannot be reached is a 503, never an open door.
type ForwardAuth struct {
	// URL is the auth service ("http://auth.internal:9091"), or Service
	// names a service of the same namespace; exactly one is set.
	URL     string `json:"url,omitempty" yaml:"url,omitempty"`
	Service string `json:"service,omitempty" yaml:"service,omitempty"`
	// URI is the path (and query) asked; default "/".
	URI string `json:"uri,omitempty" yaml:"uri,omitempty"`
	// CopyHeaders are copied from a 2xx answer onto the request.
	CopyHeaders []string `json:"copy_headers,omitempty" yaml:"copy_headers,omitempty"`
	// Timeout bounds the ask; default 5s.
	Timeout Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// RateLimit allows Requests per Window per key, summed over every gateway
// of the fleet; past it a request is answered 429 with Retry-After.
type RateLimit struct {
	Requests int      `json:"requests" yaml:"requests"`
	Window   Duration `json:"window" yaml:"window"`
	// Key is what is counted apart: "ip" (the client's address, the
	// default), "route" (every client together) or "header:<Name>".
	Key string `json:"key,omitempty" yaml:"key,omitempty"`
}

// Rate limit keys.
const (
	RateKeyIP     = "ip"
	RateKeyRoute  = "route"
	RateKeyHeader = "header:"
)

// ErrorPage is what the gateway answers itself instead of a 502, 503 or
// 504: Body with ContentType (default "text/html; charset=utf-8").
type ErrorPage struct {
	Body        string `json:"body" yaml:"body"`
	ContentType string `json:"content_type,omitempty" yaml:"content_type,omitempty"`
}

// ErrorPageStatuses are the statuses error_pages may replace.
var ErrorPageStatuses = []int{502, 503, 504}

// AccessLogPolicy says what a route's access lines carry beyond the
// defaults. Never by default: a query string, Authorization, Cookie or
// any other request header.
type AccessLogPolicy struct {
	// Query logs the query string.
	Query bool `json:"query,omitempty" yaml:"query,omitempty"`
	// Headers are request headers logged (Authorization and Cookie only
	// when named here).
	Headers []string `json:"headers,omitempty" yaml:"headers,omitempty"`
	// Off writes no access line for the route.
	Off bool `json:"off,omitempty" yaml:"off,omitempty"`
}

// MaintenanceRecord puts a namespace (Service "") or one service under
// maintenance, or takes it out (On false): every gateway answers its
// routes 503 with Message and Retry-After, HTML or JSON by Accept,
// touching no instance. A routing event of kind EventMaintenanceUpsert
// on Names.RoutingMaintenanceSubject.
type MaintenanceRecord struct {
	Namespace  string    `json:"namespace"`
	Service    string    `json:"service,omitempty"`
	On         bool      `json:"on"`
	Message    string    `json:"message,omitempty"`
	RetryAfter Duration  `json:"retry_after,omitempty"`
	By         string    `json:"by,omitempty"`
	At         time.Time `json:"at"`
}

// EventMaintenanceUpsert sets a namespace's or service's maintenance
// (MaintenanceRecord).
const EventMaintenanceUpsert = "maintenance.upsert"

// maintenanceWhole stands for a whole namespace in a maintenance subject:
// no service is named "_".
const maintenanceWhole = "_"

// RoutingMaintenanceSubject is the subject of a namespace's (service "")
// or a service's maintenance events.
func (n Names) RoutingMaintenanceSubject(namespace, service string) string {
	if service == "" {
		service = maintenanceWhole
	}
	return n.subjectPrefix() + ".routing.maintenance." + namespace + "." + service
}

// AccessLine is one request as a gateway's access log and `control logs
// --access` carry it. Never a query string, Authorization or Cookie
// unless the route's AccessLogPolicy names them.
type AccessLine struct {
	At        time.Time `json:"ts"`
	Gateway   string    `json:"gateway"`
	Namespace string    `json:"ns"`
	Service   string    `json:"svc"`
	Instance  string    `json:"instance,omitempty"`
	// Route is the index of the route in the service's routes.
	Route     int               `json:"route"`
	Method    string            `json:"method"`
	Host      string            `json:"host"`
	Path      string            `json:"path"`
	Query     string            `json:"query,omitempty"`
	Status    int               `json:"status"`
	BytesIn   int64             `json:"bytes_in"`
	BytesOut  int64             `json:"bytes_out"`
	Duration  float64           `json:"duration_s"`
	ClientIP  string            `json:"client_ip"`
	RequestID string            `json:"request_id"`
	Headers   map[string]string `json:"headers,omitempty"`
	// Sample is the share of the service's requests at this gateway that
	// were published when this line was (1: every one); a reader shows
	// it.
	Sample float64 `json:"sample"`
}

// AccessSubject is where gateway publishes the access lines of a
// namespace's service.
func (n Names) AccessSubject(namespace, service, gateway string) string {
	return n.subjectPrefix() + ".access." + namespace + "." + service + "." + SubjectToken(gateway)
}

// AccessWildcard matches every access line of a namespace (service "")
// or a service.
func (n Names) AccessWildcard(namespace, service string) string {
	if service == "" {
		return n.subjectPrefix() + ".access." + namespace + ".>"
	}
	return n.subjectPrefix() + ".access." + namespace + "." + service + ".*"
}

// RateCountsSubject is where gateways share their rate-limit counts with
// each other, every few hundred milliseconds (never per request).
func (n Names) RateCountsSubject(gateway string) string {
	return n.subjectPrefix() + ".ratelimit.counts." + SubjectToken(gateway)
}

// RateCountsWildcard matches every gateway's rate-limit counts.
func (n Names) RateCountsWildcard() string { return n.subjectPrefix() + ".ratelimit.counts.*" }
