package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// Every command of the table answers -h with its usage and flags, and
// succeeds; the whole usage lists every command.
func TestEveryCommandHasHelp(t *testing.T) {
	code, usage, _ := runCLI(t, "help")
	if code != 0 {
		t.Fatalf("control help: exit %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(usage, "control "+c.name) {
			t.Errorf("usage does not list %q:\n%s", c.name, usage)
		}
		for _, name := range append([]string{c.name}, c.aliases...) {
			for _, h := range []string{"-h", "--help"} {
				args := append(strings.Fields(name), h)
				code, out, errOut := runCLI(t, args...)
				if code != 0 {
					t.Errorf("control %s: exit %d, want 0", strings.Join(args, " "), code)
				}
				if !strings.Contains(out+errOut, "Usage: control "+c.name) || !strings.Contains(out+errOut, "Flags:") {
					t.Errorf("control %s printed no usage:\n%s%s", strings.Join(args, " "), out, errOut)
				}
			}
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"deploy", "-h"}, {"machines", "--help"}} {
		if code, _, _ := runCLI(t, args...); code != 0 {
			t.Errorf("control %s: exit %d, want 0", strings.Join(args, " "), code)
		}
	}
}

// A wrong command line exits 2 and says what is wrong, before anything
// connects.
func TestCommandLineErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"deploy"}, "want a subcommand: preview, apply, status, history, rollback"},
		{[]string{"deploy", "launch"}, `unknown subcommand "launch"`},
		{[]string{"machine", "drain"}, "control machine drain: want ID"},
		{[]string{"machine", "drain", "m1", "m2"}, "control machine drain: want ID"},
		{[]string{"deploy", "history"}, "control deploy history: want NS"},
		{[]string{"storage", "import", "x", "--from", "d"}, "control storage import: want no arguments"},
		{[]string{"storage", "import"}, "--from DIR"},
		{[]string{"storage", "forget", "s3"}, "--data DIR or --auth-dir DIR is required"},
		{[]string{"instances", "-o", "yaml"}, `-o "yaml": want text or json`},
		{[]string{"deploy", "apply"}, "-f FILE is required"},
		{[]string{"deploy", "apply", "-f", "m.yaml", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"server"}, "--data is required"},
		{[]string{"server", "--data", "d", "--log-level", "loud"}, "--log-level"},
		{[]string{"agent"}, "--data is required"},
		{[]string{"creds", "issue", "--data", "d", "-o", "f"}, "--role is required"},
		{[]string{"creds", "revoke"}, "exactly one of --user-creds FILE or --user UKEY"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("control %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}

// A command that fails exits 1 with a structured error: as text, or as JSON
// with -o json. An invalid manifest fails before anything connects.
func TestCommandFailuresAreStructured(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("namespace: Bad_NS\nservices: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unreachable := "nats://127.0.0.1:1"
	code, _, errOut := runCLI(t, "deploy", "apply", "-f", bad, "--nats", unreachable)
	if code != 1 || !strings.Contains(errOut, "error: invalid:") || !strings.Contains(errOut, "namespace") {
		t.Fatalf("invalid manifest: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "deploy", "status", "--nats", unreachable, "--timeout", "500ms")
	if code != 1 || !strings.Contains(errOut, "error: unavailable:") {
		t.Fatalf("unreachable NATS: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "machine", "drain", "m1", "--nats", unreachable, "--timeout", "500ms", "-o", "json")
	var got struct {
		Error struct{ Code, Message string }
	}
	if code != 1 || json.Unmarshal([]byte(errOut), &got) != nil || got.Error.Code != "unavailable" {
		t.Fatalf("unreachable NATS, -o json: exit %d, stderr %q", code, errOut)
	}
}

// The relay and STUN flags are checked before anything starts: a bad list,
// an IP without a relay or a wildcard STUN listener nobody can be told is a
// usage error naming the flag, and touches no store.
func TestRelayFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  serverConfig
		want string
	}{
		{serverConfig{meshRelays: "relay.example:3480,bad"}, `--mesh-relays "bad"`},
		{serverConfig{meshRelays: "a:1,,b:2"}, `--mesh-relays ""`},
		{serverConfig{meshRelayIP: "192.0.2.1"}, "--mesh-relay-ip needs --mesh-relay"},
		{serverConfig{meshRelay: "127.0.0.1:0", meshRelayIP: "not-an-ip"}, `--mesh-relay-ip "not-an-ip"`},
	} {
		_, err := tc.cfg.plane(nil, zap.NewNop())
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a usage error containing %q", tc.cfg, err, tc.want)
		}
	}
	if cfg, err := (serverConfig{meshRelays: " a:1 , b:2"}).plane(nil, zap.NewNop()); err != nil || len(cfg.MeshRelays) != 2 || cfg.MeshRelays[0] != "a:1" {
		t.Fatalf("a list without a relay of its own: %v %v", cfg.MeshRelays, err)
	}
	if _, err := (serverConfig{stunListen: "0.0.0.0:3478"}).plane(nil, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--stun-advertise") {
		t.Fatalf("a wildcard STUN listener without --stun-advertise: %v", err)
	}
}

// An invalid manifest fails before anything connects, listing each problem
// once (in the detail, by field path), as text and as JSON.
func TestInvalidManifestListsEachProblemOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte("namespace: Bad\nservices:\n  web:\n    replicas: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "deploy", "preview", "-f", file, "--nats", "nats://127.0.0.1:1")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, errOut)
	}
	for _, want := range []string{"namespace: must be a DNS label", "services.web.command: required", "services.web.replicas: must be >= 0"} {
		if n := strings.Count(errOut, want); n != 1 {
			t.Errorf("%q appears %d times, want once:\n%s", want, n, errOut)
		}
	}
	if !strings.HasPrefix(errOut, "error: invalid: invalid manifest (3 problems)\n") {
		t.Errorf("first line:\n%s", errOut)
	}
	code, _, errOut = runCLI(t, "deploy", "preview", "-f", file, "--nats", "nats://127.0.0.1:1", "-o", "json")
	var v struct {
		Error struct {
			Code    string            `json:"code"`
			Message string            `json:"message"`
			Detail  map[string]string `json:"detail"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(errOut), &v); err != nil || code != 1 {
		t.Fatalf("exit %d, %v:\n%s", code, err, errOut)
	}
	if v.Error.Code != "invalid" || v.Error.Message != "invalid manifest (3 problems)" || len(v.Error.Detail) != 3 {
		t.Errorf("json error %+v", v.Error)
	}
}
