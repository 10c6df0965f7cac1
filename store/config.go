package store

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/user"
	"strings"
)

// Config is how a part reaches the store: the NATS servers, the
// credentials it connects with and the scope of every name. The Caddy
// modules embed it as their JSON config, so `caddy.json` spells its
// settings the same way wherever they appear; binaries fill it from flags
// (AddFlags).
type Config struct {
	// NATSURL is the control plane's NATS server, or a comma-separated
	// list of a cluster's servers. Default: $EDGEPLANE_NATS, else
	// nats://127.0.0.1:4222.
	NATSURL string `json:"nats_url,omitempty"`
	// CredsFile is a NATS credentials file issued by `control creds
	// issue` or an invite. Default: none, which a storage node accepts on
	// loopback only. It carries the fleet CA that storage nodes are
	// verified against (TLS from the first byte).
	CredsFile string `json:"creds_file,omitempty"`
	// CAFile is a PEM bundle of the CAs storage nodes are verified
	// against, replacing the one the credentials carry. Default: the
	// credentials' own.
	CAFile string `json:"tls_ca_file,omitempty"`
	// Installation scopes RPC subjects. Default: "local".
	Installation string `json:"installation,omitempty"`
	// Authority scopes every stream, bucket and subject. Default:
	// "default".
	Authority string `json:"authority,omitempty"`
	// TrustRoot is the public key (O...) of the trust root that signs the
	// control plane's intent: routing events, commits and mesh peer records
	// are applied only when signed under it. Default: the root the
	// credentials carry; without credentials, the root the store names on
	// first contact, pinned from then on (TrustPinFile).
	TrustRoot string `json:"trust_root,omitempty"`
	// TrustPinFile is where a root learned on first contact is kept; set
	// by the part (a file in its data dir), not configured.
	TrustPinFile string `json:"-"`
}

// Resolve fills c's defaults in place and returns the names it scopes, or an
// error naming the setting that is not a valid name token.
func (c *Config) Resolve() (Names, error) {
	if c.NATSURL == "" {
		c.NATSURL = URLFromEnv()
	}
	names, err := NewNames(c.Installation, c.Authority)
	if err != nil {
		return Names{}, err
	}
	c.Installation, c.Authority = names.Installation, names.Authority
	return names, nil
}

// Setting returns the field a config key (nats_url, creds_file,
// tls_ca_file, installation, authority, trust_root) names, or nil for any other key: one spelling for
// the Caddyfile parsers of every module that embeds a Config.
func (c *Config) Setting(key string) *string {
	switch key {
	case "nats_url":
		return &c.NATSURL
	case "creds_file":
		return &c.CredsFile
	case "tls_ca_file":
		return &c.CAFile
	case "installation":
		return &c.Installation
	case "authority":
		return &c.Authority
	case "trust_root":
		return &c.TrustRoot
	}
	return nil
}

// AddFlags registers c's settings as the flags every client binary takes:
// --nats (default $EDGEPLANE_NATS, else nats://127.0.0.1:4222), --creds
// (default $EDGEPLANE_NATS_CREDS), --tls-ca (default $EDGEPLANE_TLS_CA),
// --installation and --authority.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSURL, "nats", URLFromEnv(), "NATS URL of the control plane, comma-separated for a cluster (env EDGEPLANE_NATS)")
	fs.StringVar(&c.CredsFile, "creds", os.Getenv("EDGEPLANE_NATS_CREDS"), "NATS credentials `FILE` from 'control creds issue' or an invite; it carries the fleet CA (env EDGEPLANE_NATS_CREDS)")
	fs.StringVar(&c.CAFile, "tls-ca", os.Getenv("EDGEPLANE_TLS_CA"), "PEM `FILE` of the CAs storage nodes are verified against (env EDGEPLANE_TLS_CA; default: the one the credentials carry)")
	fs.StringVar(&c.Installation, "installation", DefaultInstallation, "installation scope of every name")
	fs.StringVar(&c.Authority, "authority", DefaultAuthority, "authority scope of every name")
	fs.StringVar(&c.TrustRoot, "trust-root", os.Getenv("EDGEPLANE_TRUST_ROOT"), "public `KEY` (O...) of the trust root intent must be signed under (env EDGEPLANE_TRUST_ROOT; default: the one the credentials carry, else the store's on first contact)")
}

// Dial connects to c and binds to the streams and buckets a storage node
// provisioned (Open), closing the connection when binding fails. o names the
// connection and sets its timeout and reconnects; its URL and credentials
// are c's. ctx bounds the binding; without a deadline of its own, o.Timeout
// does, or ElectionWait for a storage cluster, whose leader elections
// binding waits out.
func (c Config) Dial(ctx context.Context, o ConnectOptions) (*Store, error) {
	return c.dial(ctx, o, false)
}

// DialForWrites is Dial for a client about to write: before binding, it
// checks write quorum (CheckQuorum), so a store that cannot commit refuses
// the client with quorum_unavailable, naming the missing storage nodes,
// before it has read or written anything.
func (c Config) DialForWrites(ctx context.Context, o ConnectOptions) (*Store, error) {
	return c.dial(ctx, o, true)
}

func (c Config) dial(ctx context.Context, o ConnectOptions, quorum bool) (*Store, error) {
	names, err := c.Resolve()
	if err != nil {
		return nil, &Error{Code: CodeInvalid, Message: err.Error()}
	}
	o.URL, o.CredsFile, o.CAFile = c.NATSURL, c.CredsFile, c.CAFile
	nc, err := Connect(o)
	if err != nil {
		return nil, err
	}
	if quorum {
		if err := CheckQuorum(ctx, nc, names); err != nil {
			nc.Close()
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// Binding a storage cluster waits out leader elections (ride).
		bound := cmp.Or(o.Timeout, defaultConnectTimeout)
		if nc.ConnectedClusterName() != "" {
			bound = max(bound, ElectionWait)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	anchor, err := ResolveAnchor(c.TrustRoot, c.CredsFile, c.TrustPinFile)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s, err := Open(ctx, nc, names)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.TrustAnchor(anchor)
	return s, nil
}

// HostName is this box's host name, or fallback when the system has none:
// the default name of a gateway, a machine, a storage node and a lease
// holder.
func HostName(fallback string) string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return fallback
}

// Operator names who runs this process, for the By of a record an
// operator's command writes: user@host.
func Operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if host, err := os.Hostname(); err == nil {
		return name + "@" + host
	}
	return name
}

// DefaultMachineID is the host name as a machine ID: every character a name
// token may not hold becomes '-'. The agent and meshd of one box default to
// the same ID.
func DefaultMachineID() string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, HostName("node"))
}

// DefaultHolder names this process as the holder of a lease: host and PID,
// so two processes of one box never pass for each other.
func DefaultHolder() string {
	return fmt.Sprintf("%s:%d", HostName("localhost"), os.Getpid())
}

// Follow keeps what a long-running process's connection s stands on
// current until ctx ends: the CA bundle c verifies storage nodes against
// follows the fleet's (FollowTLSBundle), and the credentials s connected
// with are renewed before they expire (RenewCreds). Nothing for a
// plaintext setup without credentials.
func (c Config) Follow(ctx context.Context, s *Store, report func(error)) {
	FollowConnection(ctx, s, cmp.Or(c.CAFile, c.CredsFile), report)
}

// FollowConnection is Config.Follow for a connection whose CA bundle comes
// from source (a credentials or CA file; "" for none).
func FollowConnection(ctx context.Context, s *Store, source string, report func(error)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		RenewCreds(ctx, s, report)
	}()
	if source != "" {
		FollowTLSBundle(ctx, s, source, 0, report)
	}
	<-done
}

// RefreshBundle reads the fleet's CA bundle in s once for the bundle c
// verifies storage nodes against (RefreshTLSBundle).
func (c Config) RefreshBundle(ctx context.Context, s *Store) error {
	if source := cmp.Or(c.CAFile, c.CredsFile); source != "" {
		return RefreshTLSBundle(ctx, s, source)
	}
	return nil
}

// DialFollowing is Dial for a long-running process: while the connection
// lives (until it closes for good; ctx bounds the dial only), the CA
// bundle it verifies storage nodes against follows the fleet's, so a CA
// rotation reaches the process, and its credentials are renewed before
// they expire (Follow). report, if set, is told what went wrong.
func (c Config) DialFollowing(ctx context.Context, o ConnectOptions, report func(error)) (*Store, error) {
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	closed := o.OnClosed
	o.OnClosed = func() {
		stop()
		if closed != nil {
			closed()
		}
	}
	s, err := c.Dial(ctx, o)
	if err != nil {
		stop()
		return nil, err
	}
	go c.Follow(fctx, s, report)
	return s, nil
}
