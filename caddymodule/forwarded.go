package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// What a trusted proxy tells the gateway. Which peers are trusted is the
// Caddy server's own trusted_proxies option: Caddy marks each request
// (the trusted_proxy variable) and derives its client address from
// client_ip_headers only for those. The gateway believes a proxy's
// X-Forwarded-Proto on the same condition, so that behind a
// TLS-terminating load balancer redirect_https does not redirect a
// request the client already sent over HTTPS, while an untrusted peer's
// header changes nothing.

// viaHTTPS reports whether the client sent r over HTTPS: to this gateway
// (r.TLS), or to a trusted proxy that says so. Of a list ("https, http"
// from proxies appending to it) the first is the client's own hop, as
// Caddy reads the left-most X-Forwarded-For.
func viaHTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); !trusted {
		return false
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(proto), "https")
}
