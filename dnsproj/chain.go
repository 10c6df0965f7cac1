package dnsproj

import (
	"context"

	"github.com/miekg/dns"
)

// Handler is one link of the query chain, after CoreDNS's plugin.Handler.
// It either writes a reply to w and returns its rcode, or passes the query
// on to the next link. When it returns one of the error rcodes (SERVFAIL,
// REFUSED, FORMERR, NOTIMP) without having written, the server writes that
// error reply for it; err is logged, never sent.
type Handler interface {
	ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error)
	// Name is the link's name in logs ("projection", "cache", "forward").
	Name() string
}

// Plugin wraps the next handler of a chain.
type Plugin func(next Handler) Handler

// Chain builds plugins[0] -> plugins[1] -> ... -> last.
func Chain(last Handler, plugins ...Plugin) Handler {
	h := last
	for i := len(plugins) - 1; i >= 0; i-- {
		h = plugins[i](h)
	}
	return h
}

// Refused ends every chain: nobody here answers the name.
type Refused struct{}

func (Refused) ServeDNS(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) {
	return dns.RcodeRefused, nil
}

func (Refused) Name() string { return "refused" }

// clientWrite reports whether a handler returning rcode is expected to have
// written its reply itself.
func clientWrite(rcode int) bool {
	switch rcode {
	case dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeFormatError, dns.RcodeNotImplemented:
		return false
	}
	return true
}
