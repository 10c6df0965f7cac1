package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
	"go.uber.org/zap"
)

// agentIdentity is what `control agent --join` saves so that later starts
// need only --data.
type agentIdentity struct {
	Machine  string    `json:"machine"`
	Address  string    `json:"address"`
	JoinedAt time.Time `json:"joined_at"`
}

func identityPath(dir string) string { return filepath.Join(dir, "agent.json") }

func setupAgent(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "agent data dir: identity, instance state and logs (required)")
	join := fs.String("join", "", "invite `TOKEN` from 'control machine invite'; needed once")
	machine := fs.String("machine", "", "machine ID (default: the hostname)")
	advertise := fs.String("advertise", "", "IP instances listen on and are reached at (default: the saved one, else this machine's mesh IP, else 127.0.0.1)")
	o := agentOptions{}
	fs.IntVar(&o.maxInstances, "max-instances", 256, "instances this machine accepts")
	fs.DurationVar(&o.stopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace when stopping instances")
	fs.DurationVar(&o.restartBackoff, "restart-backoff", time.Second, "first wait before restarting an instance that ended on its own; doubled per failure in a row")
	fs.DurationVar(&o.restartBackoffMax, "restart-backoff-max", 5*time.Minute, "longest wait between restarts")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "serve Prometheus metrics (edgeplane_agent_*) on this address's /metrics; empty: off")
	fs.DurationVar(&o.beat, "heartbeat", store.DefaultBeatInterval, "how often the agent writes this machine's heartbeat (stale after 3 missed, offline after 10)")
	fs.StringVar(&o.engine, "engine", "", "container engine socket for services with an image, e.g. unix:///run/podman/podman.sock (default: Docker's socket, then podman's, if one answers; none: no containers)")
	lf := addLogFlags(fs)
	return func(c *call) error {
		if *data == "" {
			return usagef("--data is required")
		}
		logger, err := lf.logger(c)
		if err != nil {
			return err
		}
		defer func() { _ = logger.Sync() }()
		return c.withStore(func(s *store.Store) error {
			rec, err := agentMachine(c.ctx, s, *data, *join, *machine, *advertise)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "agent for machine %s (%s) serving; instances survive this process\n", rec.ID, rec.Address)
			o.dir = *data
			return runAgent(c.ctx, s, rec, o, logger)
		})
	}
}

// agentMachine resolves the machine this agent serves: joining with a token
// once, then from the identity saved in the data dir.
func agentMachine(ctx context.Context, s *store.Store, dir, token, id, advertise string) (*store.MachineRecord, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("agent data dir: %w", err)
	}
	var ident agentIdentity
	b, err := os.ReadFile(identityPath(dir))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &ident); err != nil {
			return nil, fmt.Errorf("reading %s: %w", identityPath(dir), err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("reading agent identity: %w", err)
	}
	if token == "" {
		if ident.Machine == "" {
			return nil, store.Errorf(store.CodeNotFound, "this data dir has no machine identity; join first with --join TOKEN (from `control machine invite`)").With("data", dir)
		}
		if id != "" && id != ident.Machine {
			return nil, store.Errorf(store.CodeConflict, "data dir belongs to machine %s, not %s", ident.Machine, id)
		}
		rec, err := machines.Get(ctx, s, ident.Machine)
		if err != nil {
			return nil, err
		}
		if advertise != "" && advertise != rec.Address {
			if net.ParseIP(advertise) == nil {
				return nil, usagef("--advertise %q is not an IP address", advertise)
			}
			req := machines.AdmissionRequest{Machine: rec.ID, Address: advertise}
			if rec, err = machines.RequestAdmission(ctx, s, machines.AdmitAddress, req); err != nil {
				return nil, err
			}
		}
		return rec, nil
	}
	if id == "" {
		id = ident.Machine
	}
	if id == "" {
		id = store.DefaultMachineID()
	}
	addr, err := advertiseAddr(advertise, ident.Address, meshIP(ctx, s, id))
	if err != nil {
		return nil, err
	}
	rec, err := machines.RequestAdmission(ctx, s, machines.AdmitJoin, machines.AdmissionRequest{Machine: id, Token: token, Address: addr})
	if err != nil {
		return nil, err
	}
	ident = agentIdentity{Machine: rec.ID, Address: rec.Address, JoinedAt: rec.JoinedAt}
	b, _ = json.MarshalIndent(ident, "", "  ")
	if err := os.WriteFile(identityPath(dir), b, 0o600); err != nil {
		return nil, fmt.Errorf("saving agent identity: %w", err)
	}
	return rec, nil
}

// meshIP is machine's mesh IP if meshd registered it, else "".
func meshIP(ctx context.Context, s *store.Store, machine string) string {
	if peer, err := s.MeshPeer(ctx, machine); err == nil {
		return peer.MeshIP
	}
	return ""
}

// advertiseAddr picks the first of the flag, the saved address and the mesh
// IP that is set, else loopback.
func advertiseAddr(flagVal, saved, mesh string) (string, error) {
	v := "127.0.0.1"
	for _, c := range []string{mesh, saved, flagVal} {
		if c != "" {
			v = c
		}
	}
	if net.ParseIP(v) == nil {
		return "", usagef("--advertise %q is not an IP address", v)
	}
	return v, nil
}

// agentOptions are an agent's settings from its command line.
type agentOptions struct {
	dir                               string
	maxInstances                      int
	stopGrace                         time.Duration
	restartBackoff, restartBackoffMax time.Duration
	metricsListen                     string
	engine                            string
	beat                              time.Duration
}

func runAgent(ctx context.Context, s *store.Store, rec *store.MachineRecord, o agentOptions, logger *zap.Logger) error {
	ctr, err := connectEngine(ctx, o.engine, logger)
	if err != nil {
		return err
	}
	if ctr != nil {
		defer ctr.Close()
	}
	a, err := agent.New(agent.Config{
		Store: s, Machine: *rec, DataDir: o.dir, Driver: &runtime.Process{}, Containers: ctr,
		Logger: logger, MaxInstances: o.maxInstances, StopGrace: o.stopGrace,
		RestartBackoff: o.restartBackoff, RestartBackoffMax: o.restartBackoffMax, BeatInterval: o.beat,
	})
	if err != nil {
		return err
	}
	if o.metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(a.Collector())
		stop, err := serveMetrics(ctx, o.metricsListen, reg)
		if err != nil {
			return err
		}
		defer stop()
		logger.Info("agent metrics", zap.String("listen", o.metricsListen))
	}
	return a.Run(ctx)
}

// connectEngine connects the container driver to engine; "" tries the
// default sockets and settles for none, "none" is none.
func connectEngine(ctx context.Context, engine string, logger *zap.Logger) (*runtime.Container, error) {
	if engine == "none" {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if engine != "" {
		c, err := runtime.ConnectEngine(cctx, engine)
		if err != nil {
			return nil, fmt.Errorf("--engine: %w", err)
		}
		logger.Info("container engine", zap.String("engine", engine), zap.String("api_version", c.APIVersion))
		return c, nil
	}
	for _, sock := range runtime.DefaultEngineSockets {
		if _, err := os.Stat(strings.TrimPrefix(sock, "unix://")); err != nil {
			continue
		}
		if c, err := runtime.ConnectEngine(cctx, sock); err == nil {
			logger.Info("container engine", zap.String("engine", sock), zap.String("api_version", c.APIVersion))
			return c, nil
		}
	}
	logger.Info("no container engine: services with an image are refused on this machine (see --engine)")
	return nil, nil
}

// serveMetrics serves reg's /metrics on addr until stop is called.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}
