package store_test

import (
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

func TestHostKeyKeepsEverythingUnderANameUnderOnePrefix(t *testing.T) {
	for host, want := range map[string]string{
		"api.example.com":   "com.example.api",
		"*.example.com":     "com.example._",
		"a.b.example.com":   "com.example.b.a",
		"xn--bcher-kva.com": "com.xn--bcher-kva",
	} {
		if got := store.HostKey(host); got != want {
			t.Errorf("HostKey(%q) = %q, want %q", host, got, want)
		}
	}
}
