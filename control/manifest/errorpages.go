package manifest

import (
	"fmt"
	"maps"
	"mime"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// MaxErrorPageBody bounds an error page: it travels in every routing
// upsert of its service and every gateway keeps it in memory.
const MaxErrorPageBody = 64 << 10

// validateErrorPages checks a route's error_pages (p is the route's
// path): only the statuses the gateway answers itself for
// (store.ErrorPageStatuses), a body within MaxErrorPageBody, and a
// content type the gateway can send as it is: one media type, text or
// a JSON or XML document, without a line break that would split the
// header.
func validateErrorPages(p string, r *store.Route, add func(path, format string, args ...any)) {
	for _, code := range slices.Sorted(maps.Keys(r.ErrorPages)) {
		ep := r.ErrorPages[code]
		fp := fmt.Sprintf("%s.error_pages.%d", p, code)
		if !slices.Contains(store.ErrorPageStatuses, code) {
			add(fp, "only 502, 503 and 504 have error pages: the gateway answers them itself when an instance cannot")
			continue
		}
		switch {
		case ep.Body == "":
			add(fp+".body", "required")
		case len(ep.Body) > MaxErrorPageBody:
			add(fp+".body", "is %d bytes; at most %d (64 KiB)", len(ep.Body), MaxErrorPageBody)
		}
		if ep.ContentType != "" {
			if err := errorPageType(ep.ContentType); err != nil {
				add(fp+".content_type", "%v", err)
			}
		}
	}
}

// errorPageType is nil when ct is a content type an error page may have.
func errorPageType(ct string) error {
	if strings.ContainsAny(ct, "\r\n\x00") {
		return fmt.Errorf("a content type cannot hold a line break or NUL")
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("not a media type: %v", err)
	}
	typ, sub, ok := strings.Cut(mt, "/")
	if !ok {
		return fmt.Errorf("not a media type: %q names no subtype (text/html)", mt)
	}
	switch {
	case typ == "text",
		typ == "application" && (sub == "json" || sub == "xml" || strings.HasSuffix(sub, "+json") || strings.HasSuffix(sub, "+xml")):
		return nil
	}
	return fmt.Errorf("%q: want text/* or a JSON or XML document (application/json, application/problem+json, application/xhtml+xml)", mt)
}
