// Command control is edgeplane's orchestrator and per-machine agent.
//
//	control server --data DIR [--listen 127.0.0.1:4222] [--agent] ...
//	control agent --data DIR [--join TOKEN] [--machine ID] [--advertise IP]
//	control machine invite|ls|drain|disable|enable
//	control deploy preview|apply|status|history|rollback
//	control instances [--namespace NS]
//	control certs
//	control storage ls|add|remove|forget|import
//	control creds issue|revoke
//
// Run `control help` or `control COMMAND -h` for the flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

const usage = `control is edgeplane's orchestrator and per-machine agent.

Usage:
  control server   --data DIR [--listen 127.0.0.1:4222] [--agent] [--installation local] [--authority default]
  control agent    --data DIR [--join TOKEN] [--machine ID] [--advertise IP]
  control machine  invite [--region R] [--label k=v]... | ls | drain ID | disable ID | enable ID
  control deploy   preview -f FILE | apply -f FILE | status [NS] | history NS | rollback NS [--to COMMIT]
  control instances [--namespace NS]
  control certs    # certificates: issuer, expiry, last renewal attempt and error
  control storage  ls | add NODE | remove NODE | forget NODE | import --from DIR   # storage nodes, quorum, placement
  control creds    issue --role control|gateway|agent|mesh [--machine ID] --data DIR -o FILE | revoke --user-creds FILE

Cluster: storage nodes run 'control server --name N --cluster-listen HOST:PORT --routes A,B,C'
(three or five of them); other boxes run 'control server --storage=false --nats URL' or only
agents and gateways. Any non-loopback listener requires --auth (credentials on every connection).
Mutating commands fail with quorum_unavailable, naming the missing storage nodes, when the
store cannot commit.

Client commands take --nats URL (default $EDGEPLANE_NATS or nats://127.0.0.1:4222),
--creds FILE, --installation, --authority; read commands take -o json.
Run 'control COMMAND [SUBCOMMAND] -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	var out *output
	switch cmd {
	case "server":
		err = cmdServer(ctx, rest, stdout, stderr)
	case "agent":
		err = cmdAgent(ctx, rest, stdout, stderr)
	case "machine", "machines":
		out, err = cmdMachine(ctx, rest, stdout)
	case "deploy":
		out, err = cmdDeploy(ctx, rest, stdout)
	case "storage":
		out, err = cmdStorage(ctx, rest, stdout)
	case "creds":
		out, err = cmdCreds(ctx, rest, stdout)
	case "instances":
		out, err = cmdInstances(ctx, rest, stdout)
	case "certs":
		out, err = cmdCerts(ctx, rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "control: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "control %s: %s\n", cmd, ue.msg)
		return 2
	}
	printError(stderr, err, out != nil && out.json)
	return 1
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// printError writes err for a person, or as structured JSON.
func printError(w io.Writer, err error, asJSON bool) {
	se := store.AsError(err)
	if asJSON {
		b, _ := json.MarshalIndent(map[string]any{"error": se}, "", "  ")
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "error: %s: %s\n", se.Code, se.Message)
	for _, k := range slices.Sorted(maps.Keys(se.Detail)) {
		fmt.Fprintf(w, "  %s: %s\n", k, se.Detail[k])
	}
}

// clientFlags are the flags every client command shares.
type clientFlags struct {
	nats, creds, inst, auth, format string
	timeout                         time.Duration
	// longRunning keeps reconnecting when NATS goes away (the agent)
	// instead of failing the command.
	longRunning bool
	// mutating makes open check write quorum first, so a command that
	// writes refuses before its first read or write rather than timing out
	// halfway.
	mutating bool
}

func addClientFlags(fs *flag.FlagSet, reads bool) *clientFlags {
	c := &clientFlags{}
	fs.StringVar(&c.nats, "nats", store.URLFromEnv(), "NATS URL of the control plane (env EDGEPLANE_NATS)")
	fs.StringVar(&c.creds, "creds", os.Getenv("EDGEPLANE_NATS_CREDS"), "NATS credentials file (env EDGEPLANE_NATS_CREDS)")
	fs.StringVar(&c.inst, "installation", store.DefaultInstallation, "installation scope of every name")
	fs.StringVar(&c.auth, "authority", store.DefaultAuthority, "authority scope of every name")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for NATS to answer")
	if reads {
		fs.StringVar(&c.format, "o", "text", "output format: text or json")
	}
	return c
}

// open connects and binds to the provisioned store.
func (c *clientFlags) open(ctx context.Context) (*store.Store, error) {
	if c.format != "" && c.format != "text" && c.format != "json" {
		return nil, usagef("-o %q: want text or json", c.format)
	}
	names, err := store.NewNames(c.inst, c.auth)
	if err != nil {
		return nil, usagef("%v", err)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: c.nats, CredsFile: c.creds, Name: "control cli", Timeout: c.timeout, ReconnectForever: c.longRunning})
	if err != nil {
		return nil, err
	}
	if c.mutating {
		if err := store.CheckQuorum(ctx, nc, names); err != nil {
			nc.Close()
			return nil, err
		}
	}
	octx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	s, err := store.Open(octx, nc, names)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// output renders read results as text or JSON.
type output struct {
	w    io.Writer
	json bool
}

func (c *clientFlags) output(w io.Writer) *output { return &output{w: w, json: c.format == "json"} }

func (o *output) emit(v any, text func(io.Writer)) error {
	if o.json {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(o.w, string(b))
		return err
	}
	text(o.w)
	return nil
}

// parse parses fs, allowing flags after positional arguments too.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func newFlagSet(name string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	return fs
}

// labelFlags collects repeated --label k=v.
type labelFlags map[string]string

func (l labelFlags) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labelFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want k=v, got %q", v)
	}
	l[k] = val
	return nil
}
