package manifest

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/edgeplane/edgeplane/store"
)

// Authentication rules (basic_auth, forward_auth). A manifest never holds
// a password: a user's hash must be one the gateway's http_basic provider
// compares (bcrypt or argon2id), and anything else is refused as a
// password in clear. Caddy's http_basic takes one hash algorithm per
// provider, so all users of one route hash with the same one. An auth
// service is an absolute http(s) URL without a path (the path asked is
// uri), or a service of the same manifest, never both.

// Limits on a route's authentication.
const (
	MaxRealm              = 128
	MaxForwardAuthTimeout = time.Minute
)

// validateAuth checks r's basic_auth and forward_auth (p is the route's
// path); services are the manifest's, which a forward_auth service must
// name.
func validateAuth(p string, r *store.Route, services map[string]store.ServiceSpec, add func(path, format string, args ...any)) {
	if ba := r.BasicAuth; ba != nil {
		validateBasicAuth(p+".basic_auth", ba, add)
	}
	if fa := r.ForwardAuth; fa != nil {
		validateForwardAuth(p+".forward_auth", fa, services, add)
	}
}

func validateBasicAuth(p string, ba *store.BasicAuth, add func(path, format string, args ...any)) {
	if len(ba.Realm) > MaxRealm || strings.ContainsFunc(ba.Realm, func(c rune) bool { return c < 0x20 || c == 0x7f || c == '"' || c == '\\' }) {
		add(p+".realm", "at most %d printable characters, without '\"' or '\\'", MaxRealm)
	}
	if len(ba.Users) == 0 {
		add(p+".users", "at least one user is required")
	}
	seen := map[string]int{}
	var first string // the first user's hash kind, which the others follow
	var firstAt int
	for i, u := range ba.Users {
		up := fmt.Sprintf("%s.users[%d]", p, i)
		switch {
		case u.Username == "":
			add(up+".username", "required")
		case strings.ContainsRune(u.Username, ':'):
			add(up+".username", "cannot hold ':' (basic credentials are user:password)")
		case strings.ContainsFunc(u.Username, func(c rune) bool { return c < 0x20 || c == 0x7f }):
			add(up+".username", "cannot hold control characters")
		default:
			if j, ok := seen[u.Username]; ok {
				add(up+".username", "%q is already users[%d]", u.Username, j)
			}
			seen[u.Username] = i
		}
		kind := store.PasswordHashKind(u.Hash)
		if kind == "" {
			add(up+".hash", "not a bcrypt or argon2id hash: a password in clear is never accepted; put its hash here (`control hash-password` prints one)")
			continue
		}
		if err := checkHash(kind, u.Hash); err != nil {
			add(up+".hash", "%v", err)
			continue
		}
		if first == "" {
			first, firstAt = kind, i
		} else if kind != first {
			add(up+".hash", "a %s hash, but users[%d] has a %s one: the users of a route hash with one algorithm", kind, firstAt, first)
		}
	}
}

// checkHash says what is wrong with a hash of the given kind that the
// gateway could not compare.
func checkHash(kind, hash string) error {
	switch kind {
	case "bcrypt":
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return fmt.Errorf("not a valid bcrypt hash: %v", err)
		}
	case "argon2id":
		// $argon2id$v=19$m=M,t=T,p=P$salt$key: the PHC string Caddy reads.
		parts := strings.Split(hash, "$")
		if len(parts) != 6 || parts[2] != "v=19" || strings.Count(parts[3], ",") != 2 || parts[4] == "" || parts[5] == "" {
			return fmt.Errorf("not a valid argon2id hash: want $argon2id$v=19$m=M,t=T,p=P$salt$key")
		}
	}
	return nil
}

func validateForwardAuth(p string, fa *store.ForwardAuth, services map[string]store.ServiceSpec, add func(path, format string, args ...any)) {
	switch {
	case (fa.URL == "") == (fa.Service == ""):
		add(p, "exactly one of url and service is required")
	case fa.URL != "":
		u, err := url.Parse(fa.URL)
		switch {
		case err != nil:
			add(p+".url", "not a URL: %v", err)
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
			add(p+".url", "must be an absolute http:// or https:// URL")
		case u.User != nil:
			add(p+".url", "cannot hold credentials")
		case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "":
			add(p+".url", "the auth service's address only: put the path asked in uri")
		}
	default:
		if _, ok := services[fa.Service]; !ok {
			add(p+".service", "no service %q in this manifest", fa.Service)
		}
	}
	if fa.URI != "" && !strings.HasPrefix(fa.URI, "/") {
		add(p+".uri", "must start with '/'")
	}
	if strings.ContainsAny(fa.URI, " \r\n\x00") {
		add(p+".uri", "cannot hold spaces, line breaks or NUL")
	}
	for i, h := range fa.CopyHeaders {
		if !tokenRe.MatchString(h) {
			add(fmt.Sprintf("%s.copy_headers[%d]", p, i), "not a valid header name")
		}
	}
	if d := time.Duration(fa.Timeout); d < 0 || d > MaxForwardAuthTimeout {
		add(p+".timeout", "must be between 0 (the default, 5s) and %s", MaxForwardAuthTimeout)
	}
}
