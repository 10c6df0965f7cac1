// Command control is edgeplane's orchestrator and per-machine agent.
//
//	control server --data DIR [--listen 127.0.0.1:4222] [--agent] ...
//	control agent --data DIR [--join TOKEN] [--machine ID] [--advertise IP]
//	control machine invite|ls|drain|disable|enable|address|rm
//	control region ls|drain|disable|enable
//	control deploy preview|apply|status|history|rollback
//	control instances [--namespace NS]
//	control certs
//	control storage ls|add|remove|forget|import
//	control creds issue|revoke
//
// Every command is one row of the command table (commands.go), which also
// writes the usage. Run `control help` or `control COMMAND -h` for flags.
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

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/internal/logging"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// clientUse says which shared client flags a command takes and how it
// binds to the store.
type clientUse int

const (
	// noClient: the command takes no client flags (it runs the store, or
	// works on local files).
	noClient clientUse = iota
	// reads: --nats, --creds, --installation, --authority, --timeout and
	// -o text|json; the command binds to the store.
	reads
	// writes: as reads, and the command is refused with
	// quorum_unavailable before binding when the store cannot commit;
	// --signing-key names the signer of the intent it writes.
	writes
	// certifies: as writes without -o (text output), for a command that
	// signs with the trust root of a storage node's auth dir rather than
	// with a signer.
	certifies
	// serves: the connection flags without -o, for a long-running client
	// that reconnects forever instead of failing.
	serves
)

// command is one row of the command table: its name (the words after
// `control`), what it takes and what it does. The dispatcher, every flag
// set and the usage text are made from these rows.
type command struct {
	name string
	// aliases are other full names of the command, e.g. "machine list".
	aliases []string
	// synopsis shows the positional arguments and required flags.
	synopsis string
	summary  string
	client   clientUse
	// minArgs and maxArgs bound the positional arguments (maxArgs -1:
	// any number).
	minArgs, maxArgs int
	// setup registers the command's own flags on fs and returns what runs
	// once they are parsed.
	setup func(fs *flag.FlagSet) func(*call) error
}

// call is one invocation of a command, after its flags were parsed.
type call struct {
	ctx            context.Context
	cmd            *command
	args           []string
	stdout, stderr io.Writer
	client         *clientFlags
	out            *output
}

// withStore binds to the store as the command's client flags say, for as
// long as fn runs.
func (c *call) withStore(fn func(*store.Store) error) error {
	s, err := c.client.open(c.ctx)
	if err != nil {
		return err
	}
	defer s.NC.Close()
	return fn(s)
}

// storeAnswer is the run of a command that binds to the store, asks fn
// and prints its answer: as text, or as JSON with -o json.
func storeAnswer[T interface{ WriteText(io.Writer) }](fn func(*call, *store.Store) (T, error)) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			v, err := fn(c, s)
			if err != nil {
				return err
			}
			return c.out.emit(v, v.WriteText)
		})
	}
}

// groupAliases are other names of a command group's first word.
var groupAliases = map[string]string{"machines": "machine", "regions": "region"}

// run dispatches a command line and returns the exit status: 0 for success
// and help, 1 for a failed command, 2 for a command line that is wrong.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	if g, ok := groupAliases[args[0]]; ok {
		args = append([]string{g}, args[1:]...)
	}
	cmd, rest := lookup(args)
	if cmd == nil {
		return groupUsage(args, stdout, stderr)
	}
	c := &call{ctx: ctx, cmd: cmd, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("control "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { commandUsage(fs, cmd) }
	if cmd.client != noClient {
		c.client = addClientFlags(fs, cmd.client)
	}
	do := cmd.setup(fs)
	pos, err := parse(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2 // the flag package said what is wrong
	}
	c.args = pos
	c.out = &output{w: stdout}
	if c.client != nil {
		if c.client.format != "text" && c.client.format != "json" {
			fmt.Fprintf(stderr, "control %s: -o %q: want text or json\n", cmd.name, c.client.format)
			return 2
		}
		c.out.json = c.client.format == "json"
	}
	if len(pos) < cmd.minArgs || (cmd.maxArgs >= 0 && len(pos) > cmd.maxArgs) {
		fmt.Fprintf(stderr, "control %s: want %s\n", cmd.name, argsWanted(cmd))
		return 2
	}
	err = do(c)
	if err == nil {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "control %s: %s\n", cmd.name, ue.msg)
		return 2
	}
	printError(stderr, err, c.out.json)
	return 1
}

// lookup finds the command args name (one or two words) and returns it
// with the arguments after its name.
func lookup(args []string) (*command, []string) {
	for n := min(2, len(args)); n >= 1; n-- {
		name := strings.Join(args[:n], " ")
		for i := range commands {
			if commands[i].name == name || slices.Contains(commands[i].aliases, name) {
				return &commands[i], args[n:]
			}
		}
	}
	return nil, nil
}

// groupUsage answers a command line that names no command: a group's
// subcommands for `control GROUP [-h]`, else the whole usage.
func groupUsage(args []string, stdout, stderr io.Writer) int {
	group := args[0]
	var subs []string
	for _, c := range commands {
		if g, sub, ok := strings.Cut(c.name, " "); ok && g == group {
			subs = append(subs, sub)
		}
	}
	if len(subs) == 0 {
		fmt.Fprintf(stderr, "control: unknown command %q\n\n%s", group, usage())
		return 2
	}
	if len(args) > 1 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
		fmt.Fprint(stdout, usageOf(group))
		return 0
	}
	if len(args) > 1 {
		fmt.Fprintf(stderr, "control %s: unknown subcommand %q: want %s\n\n%s", group, args[1], strings.Join(subs, ", "), usageOf(group))
		return 2
	}
	fmt.Fprintf(stderr, "control %s: want a subcommand: %s\n\n%s", group, strings.Join(subs, ", "), usageOf(group))
	return 2
}

const usageHead = "control is edgeplane's orchestrator and per-machine agent.\n\nUsage:\n"

const usageTail = `
Cluster: storage nodes run 'control server --name N --cluster-listen HOST:PORT --routes A,B,C'
(three or five of them); other boxes run 'control server --storage=false --nats URL' or only
agents and gateways. Any non-loopback listener requires --auth (credentials on every connection).
Mutating commands fail with quorum_unavailable, naming the missing storage nodes, when the
store cannot commit.

Client commands take --nats URL (default $EDGEPLANE_NATS or nats://127.0.0.1:4222),
--creds FILE ($EDGEPLANE_NATS_CREDS), --installation, --authority; read commands take -o json.
Run 'control COMMAND [SUBCOMMAND] -h' for a command's flags.
`

// usage is the whole usage text, one line per command of the table.
func usage() string { return usageHead + usageLines("") + usageTail }

// usageOf is the usage of one command group.
func usageOf(group string) string { return usageHead + usageLines(group) }

func usageLines(group string) string {
	var b strings.Builder
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name)+1+len(c.synopsis))
	}
	for _, c := range commands {
		if g, _, _ := strings.Cut(c.name, " "); group != "" && g != group {
			continue
		}
		fmt.Fprintf(&b, "  control %-*s  %s\n", width, strings.TrimSpace(c.name+" "+c.synopsis), c.summary)
	}
	return b.String()
}

// commandUsage is what `control COMMAND -h` prints.
func commandUsage(fs *flag.FlagSet, c *command) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage: control %s [flags]\n\n%s.\n", strings.TrimSpace(c.name+" "+c.synopsis), c.summary)
	if len(c.aliases) > 0 {
		fmt.Fprintf(w, "Also: control %s\n", strings.Join(c.aliases, ", control "))
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.PrintDefaults()
}

// argsWanted says, for a usage error, which positional arguments c takes.
func argsWanted(c *command) string {
	var words []string
	for _, f := range strings.Fields(c.synopsis) {
		if strings.HasPrefix(f, "-") || strings.HasPrefix(f, "[-") {
			break // flags follow
		}
		words = append(words, f)
	}
	if c.maxArgs == 0 || len(words) == 0 {
		return "no arguments"
	}
	return strings.Join(words, " ")
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
	store.Config
	format     string
	timeout    time.Duration
	use        clientUse
	signingKey string
}

func addClientFlags(fs *flag.FlagSet, use clientUse) *clientFlags {
	c := &clientFlags{use: use, format: "text"}
	c.AddFlags(fs)
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, fmt.Sprintf("how long to wait for NATS to answer (a storage cluster electing leaders after a node died is waited for up to %s)", store.ElectionWait))
	if use != serves && use != certifies {
		fs.StringVar(&c.format, "o", "text", "output format: text or json")
	}
	if use == writes {
		fs.StringVar(&c.signingKey, "signing-key", os.Getenv("EDGEPLANE_SIGNING_KEY"), "signer key `FILE` that signs the intent this writes: commits, routing events (env EDGEPLANE_SIGNING_KEY; control server writes DATA/signer.nk, 'control signing issue' makes more)")
	}
	return c
}

// open connects and binds to the provisioned store. A writer is refused
// before binding when write quorum is lost, so a command that writes fails
// before its first read or write rather than timing out halfway.
func (c *clientFlags) open(ctx context.Context) (*store.Store, error) {
	// The timeout bounds the connect and the binding; the quorum check
	// bounds itself (store.QuorumCheckTimeout).
	// The connection's name says what this CLI is, for whoever lists
	// the storage nodes' connections (it writes no record of its own).
	release, gen := store.Announcement()
	o := store.ConnectOptions{Name: fmt.Sprintf("control cli %s (schema generation %d)", release, gen), Timeout: c.timeout, ReconnectForever: c.use == serves}
	switch c.use {
	case certifies:
		return store.RefuseTooOld(c.DialForWrites(ctx, o))
	case writes:
	case serves:
		// The agent checks the floor itself when it starts.
		return c.Dial(ctx, o)
	default:
		return store.RefuseTooOld(c.Dial(ctx, o))
	}
	var signer *signing.KeyFile
	if c.signingKey != "" {
		var err error
		if signer, err = signing.OpenKeyFile(c.signingKey); err != nil {
			return nil, &store.Error{Code: store.CodeSigningKeyRequired, Message: err.Error(), Detail: map[string]string{"signing_key": c.signingKey}}
		}
	}
	s, err := store.RefuseTooOld(c.DialForWrites(ctx, o))
	if err != nil {
		return nil, err
	}
	if signer != nil {
		s.SignWith(signer)
	}
	return s, nil
}

// output renders read results as text or JSON.
type output struct {
	w    io.Writer
	json bool
}

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

// logFlags are the flags of the long-running commands, which log.
type logFlags struct{ level string }

func addLogFlags(fs *flag.FlagSet) *logFlags {
	l := &logFlags{}
	fs.StringVar(&l.level, "log-level", "info", "debug, info, warn or error; the log is JSON lines on stderr")
	return l
}

// logger is the process's one logger, on the call's stderr.
func (l *logFlags) logger(c *call) (*zap.Logger, error) {
	log, err := logging.New(c.stderr, l.level)
	if err != nil {
		return nil, usagef("--log-level: %v", err)
	}
	return log, nil
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

// listFlag collects a repeated flag's values, in order.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}
