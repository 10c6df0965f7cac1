package caddymodule

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Error pages. A route's error_pages replace the body of a 502, 503 or
// 504 answer, whoever gave it: an instance through the proxy, or the
// gateway itself (no routable instance, every one failing, a timeout,
// which the proxy returns as an error Caddy would answer with an empty
// body). The status stays; the client gets the page instead of what the
// answer carried. Only routes with error pages pay for the wrapper.

// serveErrorPages serves r, which matched m in v, with a writer that
// answers pages' statuses with their page, and answers an error the
// route returns with a page's status (nothing having been written yet)
// with that page.
func (h *Handler) serveErrorPages(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, v *projection.View, m projection.Match, pages map[int]store.ErrorPage) error {
	ew := &errorPageWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, pages: pages}
	err := h.serveRoute(ew, r, next, v, m)
	if err == nil || ew.wrote {
		return err
	}
	var herr caddyhttp.HandlerError
	if errors.As(err, &herr) {
		if page, ok := pages[herr.StatusCode]; ok {
			return writeErrorPage(w, herr.StatusCode, page)
		}
	}
	return err
}

// writeErrorPage answers code with page. The fields of the answer it
// replaces that describe a body go; the others (Retry-After, say) stay.
func writeErrorPage(w http.ResponseWriter, code int, page store.ErrorPage) error {
	h := w.Header()
	for _, k := range []string{"Content-Encoding", "Content-Range", "Etag", "Last-Modified", "Accept-Ranges", "Transfer-Encoding"} {
		h.Del(k)
	}
	ct := page.ContentType
	if ct == "" {
		ct = "text/html; charset=utf-8"
	}
	h.Set("Content-Type", ct)
	h.Set("Content-Length", strconv.Itoa(len(page.Body)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, err := io.WriteString(w, page.Body)
	return err
}

// errorPageWriter replaces an answer whose status has a page.
type errorPageWriter struct {
	caddyhttp.ResponseWriterWrapper
	pages map[int]store.ErrorPage
	// wrote is set once a final status went out; replaced when it was a
	// page's, whose body then is the page, and what follows is dropped.
	wrote, replaced bool
}

func (w *errorPageWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code < 200 {
		w.ResponseWriterWrapper.WriteHeader(code)
		return
	}
	w.wrote = true
	if page, ok := w.pages[code]; ok {
		w.replaced = true
		_ = writeErrorPage(w.ResponseWriter, code, page)
		return
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *errorPageWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *errorPageWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.replaced {
		return io.Copy(io.Discard, r)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError is what http.ResponseController calls before unwrapping: a
// replaced answer's flush must not reach the client, an unreplaced one's
// must.
func (w *errorPageWriter) FlushError() error {
	if w.replaced {
		return nil
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *errorPageWriter) Flush() { _ = w.FlushError() }
