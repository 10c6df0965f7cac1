package store

import (
	"net/http"
	"testing"
)

// One rule judges a readiness path's answer, for the agent and the gateway
// alike: 2xx is ready, anything else (a redirect not followed, a client or
// server error) is not.
func TestReadyStatus(t *testing.T) {
	for code, want := range map[int]bool{
		http.StatusOK: true, http.StatusNoContent: true, 299: true,
		http.StatusContinue: false, http.StatusFound: false, http.StatusNotModified: false,
		http.StatusNotFound: false, http.StatusTooManyRequests: false, http.StatusServiceUnavailable: false,
	} {
		if got := ReadyStatus(code); got != want {
			t.Errorf("ReadyStatus(%d) = %v, want %v", code, got, want)
		}
	}
}
