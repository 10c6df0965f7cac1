// Command meshd joins a box to edgeplane's WireGuard mesh and keeps its
// tunnels up: `meshd join` registers with the control plane's registrar,
// `meshd run` runs the device, `meshd status` shows it, `meshd leave` takes
// the box out.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/internal/logging"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
)

const usage = `usage: meshd <command> [flags]

commands:
  join    --token TOKEN --data DIR [--nats URL] [--creds FILE] [--machine ID] [--listen-port N] [--bind IP] [--mode tun|netstack]
  run     --data DIR [--nats URL] [--creds FILE] [--metrics ADDR] [--stun HOST:PORT,...] [--pidfile FILE] [--releases DIR] [intervals]
  status  --data DIR [-o json]
  leave   --data DIR [--purge] [--nats URL] [--creds FILE]
  version

--creds is a NATS credentials file with mesh credentials for this machine
(` + "`control creds issue --role mesh --machine ID -o FILE`" + ` on a storage node);
a control plane listening beyond loopback requires it. join saves its path;
run and leave reuse it unless given their own.
`

func main() {
	os.Exit(exitCode(run(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// exitCode reports err on stderr and returns the process's exit status: 0
// for success and for --help, 1 for any failure.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "meshd:", err)
	return 1
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "join":
		return cmdJoin(ctx, args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stderr)
	case "status":
		return cmdStatus(ctx, args[1:], stdout, stderr)
	case "leave":
		return cmdLeave(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version.String("meshd"))
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// newFlags is a command's flag set; its usage and parse errors go to w.
func newFlags(name string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("meshd "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	return fs
}

func cmdJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("join", stderr)
	var o node.JoinOptions
	fs.StringVar(&o.Token, "token", "", "invite `TOKEN` from 'control machine invite' (required)")
	fs.StringVar(&o.DataDir, "data", "", "data dir for keys and state (required)")
	fs.StringVar(&o.NATSURL, "nats", store.URLFromEnv(), "control plane NATS URL")
	fs.StringVar(&o.CredsFile, "creds", "", "NATS credentials file: mesh credentials for this machine (saved for run and leave); it carries the fleet CA")
	fs.StringVar(&o.CAFile, "tls-ca", os.Getenv("EDGEPLANE_TLS_CA"), "PEM `FILE` of the CAs storage nodes are verified against (env EDGEPLANE_TLS_CA; default: the one the credentials carry; saved for run and leave)")
	fs.StringVar(&o.TrustRoot, "trust-root", "", "public `KEY` (O...) peer records must be signed under (saved for run; default: the one the credentials carry, else the store's, pinned on first contact)")
	fs.StringVar(&o.Machine, "machine", store.DefaultMachineID(), "machine ID")
	fs.IntVar(&o.ListenPort, "listen-port", node.DefaultListenPort, "WireGuard UDP port (0 picks a free one and keeps it)")
	fs.StringVar(&o.Bind, "bind", "", "local IP to listen on (default: all addresses)")
	fs.Func("advertise", "`IP:PORT` peers can reach this node's WireGuard port at, tried before its own addresses: a port forward on its router (repeatable)", func(v string) error {
		if _, err := netip.ParseAddrPort(v); err != nil {
			return fmt.Errorf("want ip:port: %w", err)
		}
		o.Advertise = append(o.Advertise, v)
		return nil
	})
	fs.StringVar(&o.Mode, "mode", node.ModeTUN, "tun (kernel TUN interface) or netstack (userspace)")
	fs.StringVar(&o.Interface, "interface", "mesh0", "TUN interface name")
	fs.StringVar(&o.Installation, "installation", "", "installation (default local)")
	fs.StringVar(&o.Authority, "authority", "", "authority (default default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("join: unexpected arguments %q", fs.Args())
	}
	st, err := node.Join(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "joined as %s with mesh IP %s (port %d, mode %s); start it with: meshd run --data %s\n",
		st.Machine, st.MeshIP, st.ListenPort, st.Mode, o.DataDir)
	return nil
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	var c node.Config
	var stun, logLevel string
	fs.StringVar(&c.DataDir, "data", "", "data dir written by 'meshd join' (required)")
	fs.StringVar(&c.NATSURL, "nats", "", "control plane NATS URL (default: the one used at join)")
	fs.StringVar(&c.CredsFile, "creds", "", "NATS credentials file (default: the one used at join)")
	fs.StringVar(&c.CAFile, "tls-ca", "", "PEM `FILE` of the CAs storage nodes are verified against (default: the one used at join)")
	fs.StringVar(&c.TrustRoot, "trust-root", "", "public `KEY` (O...) peer records must be signed under (default: the one saved at join)")
	fs.StringVar(&stun, "stun", "", "comma-separated STUN servers (default: those the registrar announced)")
	fs.StringVar(&c.MetricsAddr, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9586)")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", node.DefaultHeartbeatInterval, "heartbeat interval")
	fs.DurationVar(&c.ReconcileInterval, "reconcile-interval", node.DefaultReconcileInterval, "full reconcile interval")
	fs.DurationVar(&c.STUNInterval, "stun-interval", node.DefaultSTUNInterval, "NAT discovery refresh interval")
	fs.DurationVar(&c.WatchFallback, "watch-fallback", node.DefaultWatchFallback, "poll full state after the watch is down this long")
	fs.DurationVar(&c.KeyOverlap, "key-overlap", store.DefaultMeshKeyOverlap, "after this node rotates its key, how long peers keep accepting the old one")
	fs.DurationVar(&c.RelayAfter, "relay-after", node.DefaultRelayAfter, "send to a peer through the mesh relay when no handshake completed over the direct path for this long")
	fs.DurationVar(&c.ProbeInterval, "probe-interval", node.DefaultProbeInterval, "how often a relayed peer's direct path is probed (the tunnel moves back when it answers)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	pidfile := fs.String("pidfile", "", "write meshd's PID here: a fleet upgrade stages a new meshd in its release dir and restarts it by this PID")
	releases := fs.String("releases", "", "the release dir a fleet upgrade stages meshd in (`control agent --meshd-releases`); run follows its current link (default: DATA/releases; packaged: /var/lib/edgeplane/releases/meshd, which only root writes)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.DataDir == "" {
		return errors.New("run: --data is required")
	}
	// A release a fleet upgrade staged (RELEASES/current) runs instead of
	// this binary.
	rel := upgrade.ForData(c.DataDir)
	if *releases != "" {
		rel = upgrade.Dir(*releases)
	}
	if self, err := ownBinary(); err == nil {
		next, err := rel.Follow(self)
		if err != nil {
			return fmt.Errorf("run: releases: %w", err)
		}
		if next != "" {
			return syscall.Exec(next, append([]string{next}, os.Args[1:]...), os.Environ())
		}
	}
	if *pidfile != "" {
		if err := os.WriteFile(*pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fmt.Errorf("run: --pidfile: %w", err)
		}
		defer os.Remove(*pidfile)
	}
	for _, d := range []time.Duration{c.HeartbeatInterval, c.ReconcileInterval, c.STUNInterval, c.WatchFallback, c.RelayAfter, c.ProbeInterval} {
		if d < 100*time.Millisecond {
			return fmt.Errorf("run: interval %s too short (minimum 100ms)", d)
		}
	}
	if c.KeyOverlap < time.Second || c.KeyOverlap > store.MaxMeshKeyOverlap {
		return fmt.Errorf("run: --key-overlap %s: want 1s to %s", c.KeyOverlap, store.MaxMeshKeyOverlap)
	}
	if stun != "" {
		c.STUN = strings.Split(stun, ",")
	}
	log, err := logging.New(stderr, logLevel)
	if err != nil {
		return fmt.Errorf("run: --log-level: %w", err)
	}
	defer func() { _ = log.Sync() }()
	c.Logger = log
	n, err := node.New(c)
	if err != nil {
		return err
	}
	return n.Run(ctx)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", stderr)
	var dir, out string
	fs.StringVar(&dir, "data", "", "data dir (required)")
	fs.StringVar(&out, "o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("status: --data is required")
	}
	if out != "table" && out != "json" {
		return fmt.Errorf("status: -o %q: want table or json", out)
	}
	s, err := node.QueryStatus(ctx, dir)
	if err != nil {
		return err
	}
	if out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Fprintf(stdout, "machine %s  mesh %s  %s/%s  port %d  key %s\n", s.Machine, s.MeshIP, s.Mode, s.Interface, s.ListenPort, s.PublicKey)
	fmt.Fprintf(stdout, "control %s connected=%v watch=%s source=%s\n", s.Control.URL, s.Control.Connected, s.Control.Watch, s.Control.Source)
	fmt.Fprintf(stdout, "nat %s endpoint=%s\n", s.NAT.Type, s.NAT.Endpoint)
	psk := fmt.Sprintf("preshared keys ready=%v", s.Control.PSKReady)
	if s.Control.PSKError != "" {
		psk += " error=" + s.Control.PSKError
	}
	fmt.Fprintln(stdout, psk)
	switch {
	case s.Relay.Address != "":
		fmt.Fprintf(stdout, "relay %s address=%s until %s\n", s.Relay.Server, s.Relay.Address, s.Relay.Expires.Format(time.RFC3339))
	case s.Relay.Error != "":
		fmt.Fprintf(stdout, "relay none: %s\n", s.Relay.Error)
	}
	if s.Drift != nil {
		fmt.Fprintf(stdout, "drift in_sync=%v desired=%s actual=%s at %s added=%v removed=%v dropped=%v\n",
			s.Drift.InSync, s.Drift.DesiredHash, s.Drift.ActualHash, s.Drift.At.Format(time.RFC3339), s.Drift.Added, s.Drift.Removed, s.Drift.Dropped)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tMESH IP\tENDPOINT\tPATH\tACTIVE\tPSK\tLIVENESS\tHANDSHAKE\tRX\tTX")
	for _, p := range s.Peers {
		hs := "never"
		if !p.LastHandshake.IsZero() {
			hs = (time.Duration(p.HandshakeAgeSec) * time.Second).String() + " ago"
		}
		path := "-"
		if p.Path != "" {
			path = fmt.Sprintf("%s %s", p.Path, time.Since(p.PathSince).Round(time.Second))
		}
		name := p.Machine
		if p.Key == node.KeyPrevious {
			name += " (previous key until " + p.PreviousUntil.Format(time.TimeOnly) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%v\t%s\t%s\t%d\t%d\n", name, p.MeshIP, p.Endpoint, path, p.Active, p.PSK, p.Liveness, hs, p.RxBytes, p.TxBytes)
	}
	return tw.Flush()
}

func cmdLeave(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("leave", stderr)
	var o node.LeaveOptions
	fs.StringVar(&o.DataDir, "data", "", "data dir (required)")
	fs.StringVar(&o.NATSURL, "nats", "", "control plane NATS URL (default: the one used at join)")
	fs.StringVar(&o.CredsFile, "creds", "", "NATS credentials file (default: the one used at join)")
	fs.StringVar(&o.CAFile, "tls-ca", "", "PEM `FILE` of the CAs storage nodes are verified against (default: the one used at join)")
	fs.BoolVar(&o.Purge, "purge", false, "also delete the private key and all cached state")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rep, err := node.Leave(ctx, o)
	if err != nil {
		return err
	}
	if rep == nil {
		fmt.Fprintln(stdout, "not a mesh member; purged local state")
		return nil
	}
	fmt.Fprintf(stdout, "left the mesh: %s released %s (cooldown until %s)", rep.Machine, rep.ReleasedIP, rep.CooldownUntil.Format(time.RFC3339))
	if o.Purge {
		fmt.Fprint(stdout, "; keys and state purged")
	}
	fmt.Fprintln(stdout)
	return nil
}

// ownBinary is this process's binary, symlinks resolved.
func ownBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(self)
}
