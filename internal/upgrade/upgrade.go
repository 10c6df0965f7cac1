// Package upgrade moves a machine's agent onto another release of the
// control binary and back, on the machine itself: the release dir under the
// agent's data dir, the trial an upgrade starts in, and the rules a
// starting agent follows to run the right binary. meshd and the gateway
// follow a release dir of their own the same way (Follow), staged by the
// agent.
//
// The package's binary (/usr/bin/control) is never written: under systemd
// it is read-only, and a package upgrade owns it. Releases are staged in
// DATA/releases/<version>/control, and DATA/releases/current, a symlink
// swapped atomically, names the one to run. Every start of `control agent`
// begins with Launch: it follows current (exec), counts the starts of a
// release on trial, and rolls back to the previous binary when a release on
// trial starts a second time without having been found healthy: it exited
// or was killed before its health gate passed. The health gate itself runs
// in the new agent (Confirm or RollBack before its deadline), so a release
// that hangs rolls back as well.
//
// The agent runs as root, and the services it stages for do not: every
// write into a release dir first checks that no other user can change
// what the dir, or any directory above it, names, and follows no link
// inside it (private.go). The packages keep the gateway's and meshd's
// release dirs in /var/lib/edgeplane/releases, not in the services' own
// state dirs.
package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
)

// States of an upgrade on a machine.
const (
	// StateTrial: the new release runs (or is starting) and has not passed
	// its health gate yet.
	StateTrial = "trial"
	// StateConfirmed: it passed; it is what this machine runs from now on.
	StateConfirmed = "confirmed"
	// StateRolledBack: it failed; the previous binary runs again.
	StateRolledBack = "rolled_back"
)

// LaunchedEnv marks a process that Launch exec'd, so that its own Launch
// does not count the same start twice.
const LaunchedEnv = "EDGEPLANE_AGENT_LAUNCHED"

// Trial is the record of the latest upgrade of this machine
// (DATA/releases/upgrade.json).
type Trial struct {
	Rollout string `json:"rollout,omitempty"`
	Attempt int    `json:"attempt"`
	// From and FromPath are the release that ran before and its binary;
	// To and ToPath the new one.
	From     string `json:"from"`
	FromPath string `json:"from_path"`
	To       string `json:"to"`
	ToPath   string `json:"to_path"`
	// ReadyBefore is how many instances were ready when the upgrade
	// began: the new agent must have them ready again.
	ReadyBefore int       `json:"ready_before"`
	Started     time.Time `json:"started"`
	Deadline    time.Time `json:"deadline"`
	// Boots counts starts of the new release while on trial.
	Boots  int       `json:"boots"`
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// Dir is a machine's release dir.
type Dir string

// ForData is the release dir of an agent data dir.
func ForData(data string) Dir { return Dir(filepath.Join(data, "releases")) }

func (d Dir) trialPath() string   { return filepath.Join(string(d), "upgrade.json") }
func (d Dir) currentPath() string { return filepath.Join(string(d), "current") }

// BinaryPath is where release ver's binary name is staged.
func (d Dir) BinaryPath(ver, name string) string { return filepath.Join(string(d), ver, name) }

// Load reads the latest upgrade; nil when there never was one.
func (d Dir) Load() (*Trial, error) {
	b, err := os.ReadFile(d.trialPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var t Trial
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.trialPath(), err)
	}
	return &t, nil
}

func (d Dir) save(t *Trial) error {
	t.At = time.Now().UTC()
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := d.ensure(0o700); err != nil {
		return err
	}
	return atomicfile.Write(d.trialPath(), b, 0o600)
}

// Current is the binary current names, resolved; "" when there is none
// (the installed binary runs).
func (d Dir) Current() (string, error) {
	target, err := os.Readlink(d.currentPath())
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(string(d), target)
	}
	return target, nil
}

// Point makes current name bin, atomically; "" or a binary outside the
// release dir removes it.
func (d Dir) Point(bin string) error { return d.point(bin) }

func (d Dir) point(bin string) error {
	if bin == "" || !strings.HasPrefix(bin, string(d)+string(filepath.Separator)) {
		// A binary outside the release dir is the installed one, which
		// runs when current names nothing.
		if err := os.Remove(d.currentPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	rel, err := filepath.Rel(string(d), bin)
	if err != nil {
		return err
	}
	if err := d.ensure(0o755); err != nil {
		return err
	}
	tmp := d.currentPath() + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(rel, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, d.currentPath()); err != nil {
		return err
	}
	return atomicfile.SyncDir(string(d))
}

// Stage writes release ver's binary name, as fetch writes it, into the
// release dir, executable, and returns its path. fetch must verify what it
// wrote (size, digest); the file is only put in place once it returned
// nil.
func (d Dir) Stage(ver, name string, fetch func(io.Writer) error) (string, error) {
	path := d.BinaryPath(ver, name)
	if filepath.Base(ver) != ver || ver == "." || ver == ".." || filepath.Base(name) != name {
		return "", fmt.Errorf("staging %q/%q: not a release and binary name", ver, name)
	}
	// Readable by the service user of a binary staged for another service
	// (the gateway's caddy); no other user can change any of it.
	if err := d.ensure(0o755); err != nil {
		return "", err
	}
	if err := ensurePrivateDir(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("staging release %s: %w", ver, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+name+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := fetch(f); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Chmod(0o755); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", err
	}
	return path, atomicfile.SyncDir(filepath.Dir(path))
}

// ensure makes the release dir, or checks the one there: a real
// directory that no user but this one (or root) can change, nor any
// directory above it (see private.go). A release dir that fails says how
// to move it.
func (d Dir) ensure(perm os.FileMode) error {
	if err := ensurePrivateDir(string(d), perm); err != nil {
		return fmt.Errorf("release dir %s: %w (a release dir must be owned by the agent's user or root, as must every directory above it, "+
			"writable by no other user: packaged, /var/lib/edgeplane/releases/<service>)", string(d), err)
	}
	return nil
}

// Begin records t as the upgrade on trial and points current at its
// binary. The caller then restarts into t.ToPath.
func (d Dir) Begin(t *Trial) error {
	t.State, t.Boots, t.Reason = StateTrial, 0, ""
	if err := d.save(t); err != nil {
		return err
	}
	return d.point(t.ToPath)
}

// Confirm ends the trial: the new release stays.
func (d Dir) Confirm(t *Trial) error {
	t.State, t.Reason = StateConfirmed, ""
	return d.save(t)
}

// RollBack ends the trial in failure: current names the previous binary
// again, whose path is returned for the caller to restart into.
func (d Dir) RollBack(t *Trial, reason string) (string, error) {
	t.State, t.Reason = StateRolledBack, reason
	if err := d.point(t.FromPath); err != nil {
		return "", err
	}
	if err := d.save(t); err != nil {
		return "", err
	}
	return t.FromPath, nil
}

// GateOutcome is how a health gate ended.
type GateOutcome struct {
	// Confirmed: the release on trial passed and stays.
	Confirmed bool
	// RollBackTo is the previous binary, to restart into, when the release
	// failed (Reason says which check); "" if it passed or ctx ended.
	RollBackTo string
	Reason     string
	// Err is a rollback that could not be written.
	Err error
}

// Gate is the health gate of release t on trial: every `every` it asks
// problem what keeps the release from passing, and confirms it as soon as
// nothing does; at t's deadline it rolls it back, saying the last problem.
// A confirmation that cannot be saved counts as a problem. It returns when
// it decided or ctx ended (a zero outcome).
func (d Dir) Gate(ctx context.Context, t *Trial, every time.Duration, problem func(context.Context) string) GateOutcome {
	tick := time.NewTicker(every)
	defer tick.Stop()
	deadline := time.NewTimer(time.Until(t.Deadline))
	defer deadline.Stop()
	failing := "not checked yet"
	for {
		select {
		case <-ctx.Done():
			return GateOutcome{}
		case <-deadline.C:
			reason := fmt.Sprintf("release %s did not pass its health gate within %s: %s", t.To, t.Deadline.Sub(t.Started).Round(time.Second), failing)
			path, err := d.RollBack(t, reason)
			return GateOutcome{RollBackTo: path, Reason: reason, Err: err}
		case <-tick.C:
			if failing = problem(ctx); failing != "" {
				continue
			}
			if err := d.Confirm(t); err != nil {
				failing = "confirming the release: " + err.Error()
				continue
			}
			return GateOutcome{Confirmed: true}
		}
	}
}

// Launch decides what binary this start of the agent runs. self is this
// process's binary; launched is whether Launch of another process exec'd it
// (LaunchedEnv). It returns the binary to exec instead of going on, or ""
// to go on in this process, and the trial on way (nil if none).
func (d Dir) Launch(self string, launched bool) (execPath string, trial *Trial, err error) {
	t, err := d.Load()
	if err != nil {
		return "", nil, err
	}
	if t != nil && t.State == StateTrial && !launched {
		t.Boots++
		if t.Boots > 1 {
			// It started before and ended without passing its health
			// gate (an exit, a crash, a kill): back to the previous one.
			if _, err := d.RollBack(t, fmt.Sprintf("release %s ended before it passed its health gate (start %d)", t.To, t.Boots)); err != nil {
				return "", t, err
			}
		} else if err := d.save(t); err != nil {
			return "", t, err
		}
	}
	next, err := d.Follow(self)
	return next, t, err
}

// Follow is the binary current names when that is not self (for the
// caller to exec), else "". A current naming nothing that exists is no
// reason not to run: "" too.
func (d Dir) Follow(self string) (string, error) {
	cur, err := d.Current()
	if err != nil || cur == "" || sameFile(cur, self) {
		return "", err
	}
	if _, err := os.Stat(cur); err != nil {
		return "", nil
	}
	return cur, nil
}

func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}
