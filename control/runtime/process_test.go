package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never contained %q (has %q)", path, want, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessStartEnvLogsAndStop(t *testing.T) {
	dir := t.TempDir()
	d := &Process{PollInterval: 20 * time.Millisecond}
	h, err := d.Start(context.Background(), Spec{
		ID: "web-0", Command: []string{"sh", "-c", `echo "up $HOST:$PORT $GREETING"; exec sleep 60`},
		Env: map[string]string{"GREETING": "hi"}, Host: "127.0.0.1", Port: 4567, LogDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "web-0.log"), "up 127.0.0.1:4567 hi")
	if err := d.Stop(context.Background(), h, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	<-h.Exited()
	if !strings.Contains(h.ExitErr().Error(), "signal terminated") {
		t.Fatalf("exit: %v", h.ExitErr())
	}
}

func TestProcessStopEscalatesToKill(t *testing.T) {
	dir := t.TempDir()
	d := &Process{}
	h, err := d.Start(context.Background(), Spec{
		ID: "stubborn", Command: []string{"sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`}, LogDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "stubborn.log"), "ready")
	start := time.Now()
	if err := d.Stop(context.Background(), h, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("stopped after %s, before the grace period", el)
	}
	if !strings.Contains(h.ExitErr().Error(), "killed") {
		t.Fatalf("exit: %v", h.ExitErr())
	}
}

func TestProcessAdoptSurvivesAndNoticesExit(t *testing.T) {
	dir := t.TempDir()
	first := &Process{}
	h, err := first.Start(context.Background(), Spec{ID: "a", Command: []string{"sleep", "60"}, LogDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	st := h.State()
	second := &Process{PollInterval: 20 * time.Millisecond}
	adopted, err := second.Adopt(context.Background(), st)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	select {
	case <-adopted.Exited():
		t.Fatal("adopted instance reported exited while running")
	default:
	}
	if err := second.Stop(context.Background(), adopted, time.Second); err != nil {
		t.Fatal(err)
	}
	<-h.Exited()
	// Its PID is gone now, and a State with a different start time never
	// adopts another process that reuses the PID.
	if _, err := second.Adopt(context.Background(), st); !errors.Is(err, ErrGone) {
		t.Fatalf("adopting an exited instance: %v", err)
	}
	self := State{ID: "reused", PID: os.Getpid(), StartTicks: 1}
	if _, err := second.Adopt(context.Background(), self); !errors.Is(err, ErrGone) {
		t.Fatalf("adopting a reused pid: %v", err)
	}
}

func TestProcessStartErrors(t *testing.T) {
	d := &Process{}
	if _, err := d.Start(context.Background(), Spec{ID: "x", LogDir: t.TempDir()}); err == nil {
		t.Fatal("empty command accepted")
	}
	if _, err := d.Start(context.Background(), Spec{ID: "x", Command: []string{"/nonexistent/bin"}, LogDir: t.TempDir()}); err == nil {
		t.Fatal("missing binary accepted")
	}
}
