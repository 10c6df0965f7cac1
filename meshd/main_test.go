package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
)

// Every bad invocation fails with a message that names the problem, and
// leaves the data dir as it was.
func TestCLIBadInput(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(t.TempDir(), "junk.creds")
	if err := os.WriteFile(junk, []byte("no JWT here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"join", "--data", dir}, "--token is required"},
		{[]string{"join", "--token", "abc", "--data", dir}, "not an edgeplane invite token"},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x"}, "--data is required"},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--mode", "kernel"}, `--mode "kernel"`},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--bind", "nowhere"}, `--bind "nowhere"`},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--machine", "a.b"}, `--machine "a.b"`},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--listen-port", "70000"}, "out of range"},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--creds", filepath.Join(dir, "none.creds")}, "--creds: reading credentials"},
		{[]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--creds", junk}, "--creds: credentials " + junk},
		{[]string{"run"}, "--data is required"},
		{[]string{"run", "--data", dir}, "has not joined"},
		{[]string{"run", "--data", dir, "--heartbeat-interval", "1ms"}, "too short"},
		{[]string{"status", "--data", dir, "-o", "yaml"}, `-o "yaml"`},
		{[]string{"status", "--data", dir}, "not running"},
		{[]string{"leave", "--data", dir}, "has not joined"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		err := run(c.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("meshd %s: got %v, want error containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("bad invocations wrote %d files into the data dir", len(entries))
	}
}

// --help prints a command's flags and succeeds, for every command.
func TestCLIHelpSucceeds(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"join", "--help"}, {"run", "-h"}, {"status", "--help"}, {"leave", "-help"}} {
		var out, errb bytes.Buffer
		if code := exitCode(run(args, &out, &errb), &errb); code != 0 {
			t.Errorf("meshd %s: exit %d, want 0\n%s", strings.Join(args, " "), code, errb.String())
		}
		if !strings.Contains(out.String()+errb.String(), "Usage") && !strings.Contains(out.String(), "usage") {
			t.Errorf("meshd %s printed no usage:\n%s%s", strings.Join(args, " "), out.String(), errb.String())
		}
	}
	var errb bytes.Buffer
	if code := exitCode(run([]string{"join", "--token"}, &bytes.Buffer{}, &errb), &errb); code != 1 {
		t.Errorf("meshd join --token (no value): exit %d, want 1", code)
	}
}

// Join and leave need the control plane: with NATS unreachable they fail
// and change nothing.
func TestJoinLeaveControlPlaneDown(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	err := run([]string{"join", "--token", store.InviteTokenPrefix + "x", "--data", dir, "--nats", "nats://127.0.0.1:1",
		"--mode", "netstack", "--bind", "127.0.0.1"}, &out, &errb)
	if !store.HasCode(err, store.CodeUnavailable) {
		t.Fatalf("join with NATS down: %v", err)
	}
	if _, err := node.LoadState(dir); err != node.ErrNotJoined {
		t.Fatalf("state after failed join: %v", err)
	}
	st := &node.State{Version: 1, Machine: "m1", MeshIP: "10.100.0.1", Secret: "epnode_x", NATSURL: "nats://127.0.0.1:1", Mode: "netstack"}
	if err := node.SaveState(dir, st); err != nil {
		t.Fatal(err)
	}
	// A credentials file that is not there is named before anything runs.
	for _, cmd := range []string{"run", "leave"} {
		err := run([]string{cmd, "--data", dir, "--creds", filepath.Join(dir, "none.creds")}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "--creds: reading credentials") {
			t.Fatalf("%s with a missing --creds: %v", cmd, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("refused commands wrote into the data dir: %v", entries)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = node.Leave(ctx, node.LeaveOptions{DataDir: dir, Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("leave with NATS down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
		t.Fatalf("state lost after failed leave: %v", err)
	}
}
