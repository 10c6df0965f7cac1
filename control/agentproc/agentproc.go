// Package agentproc is the process a machine's agent runs in, around
// control/agent: which binary runs it (the release the machine upgraded
// to, or the previous one after a failed trial: internal/upgrade), going
// on as another binary in place, and the agent started with its process
// driver, its container engine and its metrics. `control agent` and
// `control server --agent` both run the agent through Run.
package agentproc

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/metricsserver"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
)

// Launch settles which binary runs the agent of cfg.DataDir and fills
// cfg's Releases, Self and Trial. When the machine's releases say another
// binary is to run (an upgrade staged, or a failed trial rolled back),
// Launch goes on as that binary (Exec) and returns only if it cannot.
func Launch(cfg *agent.Config) error {
	self, err := upgrade.Self()
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	releases := upgrade.ForData(cfg.DataDir)
	launched := os.Getenv(upgrade.LaunchedEnv) != ""
	os.Unsetenv(upgrade.LaunchedEnv)
	next, trial, err := releases.Launch(self, launched)
	if err != nil {
		return fmt.Errorf("agent releases: %w", err)
	}
	if next != "" {
		return Exec(next, true)
	}
	// A test build can make one release fail at start.
	failpoint.Hit("agent_start@" + version.Version)
	cfg.Releases, cfg.Self, cfg.Trial = releases, self, trial
	return nil
}

// Exec goes on as the agent binary path, in this process (same PID: a
// supervisor sees no exit, instances keep their parent), with this
// process's arguments except an invite, which is good once. launched
// marks an exec by Launch (upgrade.LaunchedEnv).
func Exec(path string, launched bool) error {
	args := []string{path}
	for i := 1; i < len(os.Args); i++ {
		a := os.Args[i]
		switch {
		case a == "--join" || a == "-join":
			i++
			continue
		case strings.HasPrefix(a, "--join=") || strings.HasPrefix(a, "-join="):
			continue
		}
		args = append(args, a)
	}
	if err := upgrade.Exec(path, args, launched); err != nil {
		return fmt.Errorf("restarting the agent: %w", err)
	}
	return nil
}

// Run runs the agent cfg describes until ctx ends, its instances run by
// processes and, for services with an image, by the container engine at
// the socket engine names ("": Docker's, then podman's, if one answers;
// "none": no containers). metricsListen, if set, serves the agent's
// Prometheus metrics on its /metrics.
func Run(ctx context.Context, cfg agent.Config, engine, metricsListen string) error {
	logger := cfg.Logger
	cfg.Store.SetLogger(logger)
	ctr, err := agent.ConnectEngine(ctx, engine, logger)
	if err != nil {
		return err
	}
	if ctr != nil {
		defer ctr.Close()
	}
	cfg.Driver, cfg.Containers = &runtime.Process{}, ctr
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(a.Collector())
		stop, err := metricsserver.Serve(ctx, metricsListen, reg)
		if err != nil {
			return err
		}
		defer stop()
		logger.Info("agent metrics", zap.String("listen", metricsListen))
	}
	return a.Run(ctx)
}
