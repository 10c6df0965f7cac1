package join

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/edgeplane/edgeplane/meshd/node"
)

// AddFlags registers `control join`'s flags for o (its Layout defaulting
// to the packages') and returns --no-start.
func (o *Options) AddFlags(fs *flag.FlagSet) *bool {
	o.Layout = DefaultLayout
	fs.StringVar(&o.NATSURL, "nats", os.Getenv("EDGEPLANE_NATS"), "the storage nodes' NATS URLs, comma-separated, e.g. tls://10.0.0.1:4222 (env EDGEPLANE_NATS; default: the ones the invite names)")
	fs.BoolVar(&o.Gateway, "gateway", false, "this box runs the gateway too (edgeplane-gateway)")
	fs.BoolVar(&o.Mesh, "mesh", false, "this box runs meshd too (edgeplane-meshd); the machine is admitted at its mesh IP")
	fs.StringVar(&o.Machine, "machine", "", "machine ID (default: the hostname)")
	o.Layout.addFlags(fs)
	fs.StringVar(&o.Advertise, "advertise", "", "IP instances are reached at (default: the mesh IP with --mesh, else 127.0.0.1)")
	fs.StringVar(&o.MeshMode, "mesh-mode", node.ModeTUN, "with --mesh: meshd's device, tun or netstack")
	fs.IntVar(&o.MeshPort, "mesh-port", node.DefaultListenPort, "with --mesh: meshd's WireGuard UDP port (0 picks a free one and keeps it)")
	fs.DurationVar(&o.Timeout, "timeout", 0, "how long each call to the control plane may take (default 10s)")
	fs.Func("enroll", "storage nodes' enrollment addresses `host:port`, comma-separated (default: the --nats hosts, port 4223)", func(v string) error {
		o.EnrollAddrs = splitList(v)
		return nil
	})
	return fs.Bool("no-start", false, "write everything but start nothing (without systemd, nothing is started anyway)")
}

// AddFlags registers `control leave`'s flags for o and returns --no-stop.
func (o *LeaveOptions) AddFlags(fs *flag.FlagSet) *bool {
	o.Layout = DefaultLayout
	fs.BoolVar(&o.Purge, "purge", false, "also remove the services' whole state dirs (instance state and logs, routing snapshot, certificate cache, mesh keys)")
	o.Layout.addFlags(fs)
	return fs.Bool("no-stop", false, "leave the units as they are (without systemd, nothing is stopped anyway)")
}

func (l *Layout) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&l.Etc, "etc", l.Etc, "config dir the packages installed (caddy.json, *.env)")
	fs.StringVar(&l.State, "state", l.State, "state dir the services keep their state under")
}

// Command is `control join`: Join, then the units started (or what would
// start them said, noStart), telling w what it did. A joined box is told
// so, and nothing changes.
func Command(ctx context.Context, w io.Writer, o Options, noStart bool) error {
	rec, err := Join(ctx, o)
	if already := (*AlreadyJoined)(nil); errors.As(err, &already) {
		fmt.Fprintf(w, "already joined as %s: nothing changed\n", already.Record.Machine)
		return nil
	}
	if err != nil {
		return err
	}
	rec.Print(w)
	return RunOrSay(ctx, w, StartCommand(rec.Units), noStart)
}

// LeaveCommand is `control leave`: the units stopped (or what would stop
// them said, noStop), then Leave, telling w what it did and what is left
// to undo elsewhere.
func LeaveCommand(ctx context.Context, w io.Writer, o LeaveOptions, noStop bool) error {
	if rec, err := Joined(o.Layout); err == nil && rec != nil && len(rec.Units) > 0 {
		if err := RunOrSay(ctx, w, StopCommand(rec.Units), noStop); err != nil {
			return err
		}
	}
	left, err := Leave(ctx, o)
	if left != nil {
		left.Print(w)
	}
	if err != nil {
		return err
	}
	PrintNotUndone(w, left.Record.Machine)
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
