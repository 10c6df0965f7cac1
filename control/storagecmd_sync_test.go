package main

import (
	"os"
	"strings"
	"testing"
)

// A bad --sync is a usage error naming the flag, before any storage node
// starts; --sync with --nats is refused, since the storage nodes' own
// --sync decides.
func TestSyncFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sync", "never"}, `--sync "never": want always`},
		{[]string{"--sync", "0s"}, `--sync "0s": want always`},
		{[]string{"--sync", "2m", "--nats", "nats://127.0.0.1:1"}, "--sync applies to the storage node this server runs"},
	} {
		data := t.TempDir()
		code, _, errOut := runCLI(t, append([]string{"server", "--data", data, "--stun-listen", ""}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errOut, tc.want)
		}
		if ents, _ := os.ReadDir(data); len(ents) != 0 {
			t.Errorf("%v: the data dir was written: %v", tc.args, ents)
		}
	}
}
