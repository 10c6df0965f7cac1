// Package supervise is the `caddy supervise` command: it runs the gateway
// (`caddy run`) as a child and, on SIGHUP, replaces it with a new process,
// possibly of a new binary, without refusing a connection or failing a
// request. The new child starts beside the old one on the same ports
// (Caddy sets SO_REUSEPORT on every listener on Linux, so both are bound at
// once and the kernel spreads new connections over them); once it serves,
// with its routing loaded from the store, the old child is stopped
// gracefully: it closes its listeners and finishes the requests it holds.
// A new child that does not come up in time is stopped instead, and the
// old one keeps serving.
//
// Connections the kernel queued on the old listener and that it never
// accepted are reset when it closes, unless net.ipv4.tcp_migrate_req is 1
// (Linux 5.14+), which moves them to the new listener; the package's
// sysctl.d file sets it.
package supervise

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "supervise",
		Usage: "--config <path> [--binary <path>] [--ready-timeout <duration>] [--drain <duration>] [--stop-timeout <duration>] [--pidfile <path>]",
		Short: "Runs the gateway as a child and swaps it for a new process on SIGHUP, dropping no request",
		Long: `
Runs 'caddy run --config <path>' as a child process. On SIGHUP a
new child (of --binary as it resolves then, by default this executable) is
started beside the running one on the same ports (SO_REUSEPORT); once it
logs that it serves its configuration and, with an edgeplane app, that its
routing projection is loaded from the store, the old child is told to
drain (SIGUSR2: its edgeplane handler answers with Connection: close, so
clients reconnect between requests) for --drain, then sent SIGTERM
(Caddy's graceful stop). A new child that is not ready within
--ready-timeout, or exits, is stopped and the old one keeps serving.
SIGTERM or SIGINT stops the child and then the supervisor.

The outcome of each swap is written next to --pidfile, as <pidfile>.swap
(one line: "ok <binary>" or "failed <binary>: <why>").
`,
		Flags: func() *flag.FlagSet {
			fs := flag.NewFlagSet("supervise", flag.ExitOnError)
			fs.String("config", "", "Caddy config file (required)")
			fs.String("binary", "", "the Caddy binary to run, resolved again at each swap (e.g. a symlink a release swaps); this executable while it names nothing")
			fs.Duration("ready-timeout", 60*time.Second, "how long a new child has to serve before the swap is abandoned")
			fs.Duration("drain", 2*time.Second, "how long the old child answers with Connection: close (SIGUSR2) before it is stopped; 0: no drain")
			fs.Duration("stop-timeout", 5*time.Minute, "how long the old child has to finish its requests before it is killed")
			fs.String("pidfile", "", "write the supervisor's PID here (what sends it SIGHUP reads it)")
			return fs
		}(),
		Func: cmdSupervise,
	})
}

func cmdSupervise(fl caddycmd.Flags) (int, error) {
	cfg := fl.String("config")
	if cfg == "" {
		return 2, errors.New("--config is required")
	}
	s := &Supervisor{Binary: fl.String("binary"), Args: []string{"run", "--config", cfg},
		ReadyTimeout: fl.Duration("ready-timeout"), DrainDelay: fl.Duration("drain"), StopTimeout: fl.Duration("stop-timeout"), Out: os.Stderr}
	if pf := fl.String("pidfile"); pf != "" {
		if err := os.WriteFile(pf, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			return 1, err
		}
		defer os.Remove(pf)
		s.SwapFile = pf + ".swap"
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	swap := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case swap <- struct{}{}:
			default:
			}
		}
	}()
	if err := s.Run(ctx, swap); err != nil {
		return 1, err
	}
	return 0, nil
}

// ReadyMarkers are the log messages a child prints once it serves: Caddy's
// own, and the edgeplane projection's load from the store (a child whose
// config has no edgeplane app is ready with the first alone).
var ReadyMarkers = []string{`"serving initial configuration"`, `"routing projection loaded from the store"`}

// Supervisor runs one gateway child at a time, two during a swap.
type Supervisor struct {
	// Binary is the Caddy to run, resolved at each start; "" is this
	// executable.
	Binary string
	// Args are the child's arguments ("run --config ...").
	Args         []string
	ReadyTimeout time.Duration
	// DrainDelay is how long the old child drains (see drain) before it
	// is stopped; 0 skips draining.
	DrainDelay  time.Duration
	StopTimeout time.Duration
	// Out receives the children's output.
	Out io.Writer
	// SwapFile, if set, records each swap's outcome.
	SwapFile string

	outMu sync.Mutex
}

// child is one gateway process.
type child struct {
	cmd    *exec.Cmd
	binary string
	ready  chan struct{}
	exited chan struct{}
	err    error
}

// Run starts the first child and swaps on each receive from swap until ctx
// ends; then it stops the child. It returns when the child exits on its
// own (a supervisor restart is systemd's job) or after the stop.
func (s *Supervisor) Run(ctx context.Context, swap <-chan struct{}) error {
	cur, err := s.start()
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			s.stop(cur)
			return nil
		case <-cur.exited:
			return fmt.Errorf("gateway child %s exited: %v", cur.binary, cur.err)
		case <-swap:
			next, err := s.start()
			if err == nil {
				err = s.waitReady(ctx, next)
			}
			if err != nil {
				s.outcome("failed %s: %v", s.binaryName(), err)
				if next != nil {
					s.stop(next)
				}
				continue
			}
			s.drain(ctx, cur)
			s.stop(cur)
			cur = next
			s.outcome("ok %s", cur.binary)
		}
	}
}

func (s *Supervisor) binaryName() string {
	b, err := s.resolve()
	if err != nil {
		return s.Binary
	}
	return b
}

// resolve is the binary to start now: Binary as it resolves, or this
// executable when Binary is unset or names nothing (no release was staged
// yet).
func (s *Supervisor) resolve() (string, error) {
	if s.Binary != "" {
		b, err := filepath.EvalSymlinks(s.Binary)
		if !errors.Is(err, os.ErrNotExist) {
			return b, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(self)
}

func (s *Supervisor) note(format string, args ...any) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	fmt.Fprintf(s.Out, "supervise: %s\n", fmt.Sprintf(format, args...))
}

// outcome notes a swap's outcome, in SwapFile too.
func (s *Supervisor) outcome(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	s.note("swap: %s", line)
	if s.SwapFile != "" {
		_ = os.WriteFile(s.SwapFile, []byte(line+"\n"), 0o644)
	}
}

// start launches a child; its output is copied to s.Out and watched for
// the ready markers.
func (s *Supervisor) start() (*child, error) {
	bin, err := s.resolve()
	if err != nil {
		return nil, fmt.Errorf("resolving the gateway binary: %w", err)
	}
	c := &child{binary: bin, ready: make(chan struct{}), exited: make(chan struct{})}
	c.cmd = exec.Command(bin, s.Args...)
	c.cmd.Stdout = s.Out
	pr, pw := io.Pipe()
	c.cmd.Stderr = pw
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s.note("started %s (pid %d)", bin, c.cmd.Process.Pid)
	needProjection := s.hasEdgeplane()
	go func() {
		var served, loaded, closed bool
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			s.outMu.Lock()
			fmt.Fprintln(s.Out, line)
			s.outMu.Unlock()
			if closed {
				continue
			}
			served = served || strings.Contains(line, ReadyMarkers[0])
			loaded = loaded || strings.Contains(line, ReadyMarkers[1])
			if served && (loaded || !needProjection) {
				close(c.ready)
				closed = true
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		c.err = c.cmd.Wait()
		pw.Close()
		close(c.exited)
	}()
	return c, nil
}

// hasEdgeplane reports whether the config names the edgeplane app, whose
// projection load the ready check then waits for.
func (s *Supervisor) hasEdgeplane() bool {
	for i, a := range s.Args {
		if a == "--config" && i+1 < len(s.Args) {
			b, err := os.ReadFile(s.Args[i+1])
			return err == nil && strings.Contains(string(b), `"edgeplane"`)
		}
	}
	return false
}

// waitReady waits until c serves, exits or runs out of time.
func (s *Supervisor) waitReady(ctx context.Context, c *child) error {
	t := time.NewTimer(s.ReadyTimeout)
	defer t.Stop()
	select {
	case <-c.ready:
		return nil
	case <-c.exited:
		return fmt.Errorf("the new gateway exited before it served: %v", c.err)
	case <-t.C:
		return fmt.Errorf("the new gateway did not serve within %s", s.ReadyTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain tells c to close each client connection after its next response
// (the edgeplane handler answers "Connection: close" once it got
// SIGUSR2), for DrainDelay, so that stopping it closes no connection under
// a request.
func (s *Supervisor) drain(ctx context.Context, c *child) {
	if s.DrainDelay <= 0 {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGUSR2)
	t := time.NewTimer(s.DrainDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.exited:
	case <-ctx.Done():
	}
}

// stop ends c gracefully (SIGTERM: Caddy closes its listeners and finishes
// its requests), killing it after StopTimeout.
func (s *Supervisor) stop(c *child) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(s.StopTimeout)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	s.note("stopped %s (pid %d)", c.binary, c.cmd.Process.Pid)
}
