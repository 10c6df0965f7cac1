package join

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
)

// packagedBox is a layout holding the packaged configs, as dpkg leaves
// them, and an empty state dir.
func packagedBox(t *testing.T) Layout {
	t.Helper()
	l := Layout{Etc: t.TempDir(), State: t.TempDir()}
	for src, dst := range map[string]string{"../../packaging/etc/agent.env": "agent.env", "../../caddy.json": "caddy.json"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(l.Etc, dst), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// snapshot is every file under dirs with its content.
func snapshot(t *testing.T, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range dirs {
		err := filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			b := []byte("dir")
			if !fi.IsDir() {
				b, err = os.ReadFile(p)
			}
			out[p] = fi.Mode().String() + " " + string(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sameFiles(t *testing.T, before, after map[string]string) {
	t.Helper()
	for p, v := range after {
		if before[p] != v {
			t.Errorf("%s written", p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("%s removed", p)
		}
	}
}

// The agent's env names the storage nodes given, whatever it named; its
// other flags stay.
func TestAgentEnvNamesTheStore(t *testing.T) {
	packaged, err := os.ReadFile("../../packaging/etc/agent.env")
	if err != nil {
		t.Fatal(err)
	}
	got := string(AgentEnv(packaged, "tls://10.0.0.1:4222,tls://10.0.0.2:4222"))
	if !strings.Contains(got, "AGENT_ARGS=--nats tls://10.0.0.1:4222,tls://10.0.0.2:4222 --gateway-releases /var/lib/edgeplane/releases/gateway") ||
		strings.Contains(got, "127.0.0.1:4222") || !strings.Contains(got, "# Flags of `control agent`") {
		t.Fatalf("agent.env:\n%s", got)
	}
	for in, want := range map[string]string{
		"# none\n":                        "# none\nAGENT_ARGS=--nats tls://a:4222\n",
		"AGENT_ARGS=--heartbeat 5s\n":     "AGENT_ARGS=--nats tls://a:4222 --heartbeat 5s\n",
		"AGENT_ARGS=--nats=nats://x:1 -v": "AGENT_ARGS=--nats tls://a:4222 -v",
	} {
		if got := string(AgentEnv([]byte(in), "tls://a:4222")); got != want {
			t.Errorf("AgentEnv(%q) = %q, want %q", in, got, want)
		}
	}
}

// The gateway's config reaches the store with its credentials in both
// places that connect, and reports under the machine's name (the one its
// credentials may write); the rest of the packaged config stays.
func TestGatewayConfigReachesTheStore(t *testing.T) {
	var cfg map[string]any
	b, _ := os.ReadFile("../../caddy.json")
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	out, err := GatewayConfig(cfg, "tls://10.0.0.1:4222", "/var/lib/edgeplane/gateway/gateway.creds", "box1")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Storage map[string]any `json:"storage"`
		Apps    struct {
			Edgeplane map[string]any `json:"edgeplane"`
			HTTP      map[string]any `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for _, m := range []map[string]any{got.Storage, got.Apps.Edgeplane} {
		if m["nats_url"] != "tls://10.0.0.1:4222" || m["creds_file"] != "/var/lib/edgeplane/gateway/gateway.creds" {
			t.Errorf("not pointed at the store: %v", m)
		}
	}
	if got.Apps.Edgeplane["gateway_name"] != "box1" || got.Apps.Edgeplane["snapshot_path"] != "/var/lib/edgeplane/gateway/routing.json" || got.Apps.HTTP["servers"] == nil {
		t.Errorf("edgeplane app %v, http %v", got.Apps.Edgeplane, got.Apps.HTTP)
	}
	if _, err := GatewayConfig(map[string]any{"apps": map[string]any{}}, "u", "c", "m"); !store.HasCode(err, store.CodeInvalid) {
		t.Errorf("a config without the edgeplane app: %v", err)
	}
}

// An invite join cannot use, or a box it cannot write, is refused before
// anything is sent or written.
func TestJoinRefusesBeforeWriting(t *testing.T) {
	l := packagedBox(t)
	good := invites.WithCAs(store.InviteTokenPrefix+"c2VjcmV0", []string{strings.Repeat("ab", 32)})
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"not an invite", Options{Token: "hello", NATSURL: "tls://127.0.0.1:1"}, "not an edgeplane invite token"},
		{"no fleet CA", Options{Token: store.InviteTokenPrefix + "c2VjcmV0", NATSURL: "tls://127.0.0.1:1"}, "names no fleet CA"},
		{"bad CA", Options{Token: store.InviteTokenPrefix + "c2VjcmV0.xx", NATSURL: "tls://127.0.0.1:1"}, "is not a CA fingerprint"},
		{"no store", Options{Token: good}, "--nats"},
		{"unreadable store", Options{Token: good + ".!"}, "store URLs"},
		// The store the invite names is the one asked: nothing answers there.
		{"the invite's store", Options{Token: invites.WithStore(good, []string{"tls://127.0.0.1:1"})}, "enrollment at 127.0.0.1:4223"},
		{"bad machine", Options{Token: good, NATSURL: "tls://127.0.0.1:1", Machine: "a.b"}, "machine id"},
		{"no such user", Options{Token: good, NATSURL: "tls://127.0.0.1:1", Gateway: true, ServiceUser: "no-such-user-here"}, "service user"},
		// Nothing answers at the enrollment address: refused, unspent.
		{"no storage node", Options{Token: good, NATSURL: "tls://127.0.0.1:1", Mesh: true, ServiceUser: me.Username}, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, l.Etc, l.State)
			tc.o.Layout = l
			_, err := Join(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error()+string(store.AsError(err).Code), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			sameFiles(t, before, snapshot(t, l.Etc, l.State))
		})
	}
	gone := Layout{Etc: l.Etc, State: filepath.Join(l.State, "missing")}
	if _, err := Join(context.Background(), Options{Layout: gone, Token: good, NATSURL: "tls://127.0.0.1:1"}); !store.HasCode(err, store.CodeInvalid) ||
		!strings.Contains(err.Error(), "install the edgeplane packages") {
		t.Fatalf("no state dir: %v", err)
	}
}

// A box joined already, by join or by its agent's --join, is not joined
// again: nothing is read from the invite, nothing written.
func TestJoinedBoxJoinsNoMore(t *testing.T) {
	l := packagedBox(t)
	if err := os.MkdirAll(filepath.Join(l.State, "agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.State, "agent", "agent.json"), []byte(`{"machine":"box1","address":"10.0.0.5"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, l.Etc, l.State)
	_, err := Join(context.Background(), Options{Layout: l, Token: "anything"})
	var already *AlreadyJoined
	if !errors.As(err, &already) || already.Record.Machine != "box1" || !strings.Contains(err.Error(), "already joined as box1") {
		t.Fatalf("joined box: %v", err)
	}
	sameFiles(t, before, snapshot(t, l.Etc, l.State))
	// leave undoes only what join wrote: a box joined by hand is the
	// operator's to take apart.
	if _, err := Leave(context.Background(), LeaveOptions{Layout: l}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("leave of a box joined by hand: %v", err)
	}
	sameFiles(t, before, snapshot(t, l.Etc, l.State))
	if _, err := Leave(context.Background(), LeaveOptions{Layout: packagedBox(t)}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("leave of a box never joined: %v", err)
	}
}

// --no-start (and --no-stop) write the units' command line instead of
// running it, systemd or not.
func TestRunOrSaySaysWhenToldNotToRun(t *testing.T) {
	var w strings.Builder
	if err := RunOrSay(context.Background(), &w, StartCommand([]string{UnitAgent, UnitMeshd}), true); err != nil {
		t.Fatal(err)
	}
	if got := w.String(); got != "would run: systemctl enable --now edgeplane-agent.service edgeplane-meshd.service\n" {
		t.Fatalf("said %q", got)
	}
}
