package manifest

import (
	"fmt"
	"net/http"

	"github.com/edgeplane/edgeplane/store"
)

// MaxAccessLogHeaders bounds the request headers a route's access lines
// carry: each is in every line the gateway writes.
const MaxAccessLogHeaders = 16

// validateAccessLog checks a route's access_log (p is the route's path):
// headers are header names, each once; off logs nothing, so nothing else
// may be asked of it.
func validateAccessLog(p string, r *store.Route, add func(path, format string, args ...any)) {
	al := r.AccessLog
	if al == nil {
		return
	}
	ap := p + ".access_log"
	if al.Off && (al.Query || len(al.Headers) > 0) {
		add(ap, "off writes no access line: query and headers do not apply")
	}
	if len(al.Headers) > MaxAccessLogHeaders {
		add(ap+".headers", "at most %d headers", MaxAccessLogHeaders)
	}
	seen := map[string]int{}
	for i, h := range al.Headers {
		hp := fmt.Sprintf("%s.headers[%d]", ap, i)
		if !tokenRe.MatchString(h) {
			add(hp, "not a valid header name")
			continue
		}
		k := http.CanonicalHeaderKey(h)
		if j, ok := seen[k]; ok {
			add(hp, "header %s is already at headers[%d]", k, j)
			continue
		}
		seen[k] = i
	}
}
