package manifest

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// MaxIPListEntries bounds a route's allow and deny lists, each: the
// gateway looks a client up in a sorted table, so the cost per request
// barely grows with the list, but the manifest and every gateway's memory
// do.
const MaxIPListEntries = 10000

// validateIPLists checks a route's allow and deny lists (p is the route's
// path) and writes each entry back normalised, as hosts are: an address
// in its canonical form ("2001:db8::1", an IPv4-mapped address as IPv4), a
// CIDR as netip prints it. A CIDR with host bits set is refused rather
// than masked: "10.1.2.3/8" may mean 10.0.0.0/8 or a typo for /32, and
// guessing wrong opens or closes the route to millions of addresses.
func validateIPLists(p string, r *store.Route, add func(path, format string, args ...any)) {
	if r.Allow != nil && len(r.Allow) == 0 {
		add(p+".allow", "an empty allow list would refuse every client: omit it to allow all, or name who may reach the route")
	}
	allowed := normaliseIPList(p+".allow", "allow", r.Allow, add)
	denied := normaliseIPList(p+".deny", "deny", r.Deny, add)
	for e, i := range denied {
		if j, ok := allowed[e]; ok {
			add(fmt.Sprintf("%s.allow[%d]", p, j), "%s is also at deny[%d], and deny wins: the allow entry admits no one", e, i)
		}
	}
}

// normaliseIPList normalises list in place and returns where each entry
// first is, for the cross-list check.
func normaliseIPList(p, name string, list []string, add func(path, format string, args ...any)) map[string]int {
	if len(list) > MaxIPListEntries {
		add(p, "%d entries: at most %d", len(list), MaxIPListEntries)
		return nil
	}
	seen := make(map[string]int, len(list))
	for i, e := range list {
		ep := fmt.Sprintf("%s[%d]", p, i)
		norm, err := NormalizeIPEntry(e)
		if err != nil {
			add(ep, "%v", err)
			continue
		}
		list[i] = norm
		if j, ok := seen[norm]; ok {
			add(ep, "%s is already at %s[%d]", norm, name, j)
			continue
		}
		seen[norm] = i
	}
	return seen
}

// NormalizeIPEntry returns an allow or deny entry (an IP address or a
// CIDR) in its canonical form, or why it is neither.
func NormalizeIPEntry(e string) (string, error) {
	s := strings.TrimSpace(e)
	if s == "" {
		return "", fmt.Errorf("empty: want an IP address or a CIDR")
	}
	if strings.Contains(s, "%") {
		return "", fmt.Errorf("%q has an IPv6 zone: a zone names an interface of one machine, not a client", e)
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return "", fmt.Errorf("%q is not an IP address or a CIDR", e)
		}
		return a.Unmap().String(), nil
	}
	pf, err := netip.ParsePrefix(s)
	if err != nil {
		return "", fmt.Errorf("%q is not an IP address or a CIDR", e)
	}
	if pf.Addr().Is4In6() {
		return "", fmt.Errorf("%q is an IPv4-mapped IPv6 CIDR: write it as IPv4 (the gateway sees IPv4 clients as IPv4)", e)
	}
	if m := pf.Masked(); m != pf {
		return "", fmt.Errorf("%q has bits set past its /%d: did you mean %s (or the address alone)?", e, pf.Bits(), m)
	}
	return pf.String(), nil
}
