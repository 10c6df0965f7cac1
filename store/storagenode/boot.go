package storagenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
)

// BootConfig is everything a storage node's start-up needs: `control
// server` fills it from its flags. The zero value of every field but
// DataDir is a working default.
type BootConfig struct {
	// DataDir holds the JetStream store (DataDir/jetstream), the lock that
	// keeps a second server off it, the control credentials Boot writes
	// (DataDir/control.creds) and, by default, the auth dir. Required.
	DataDir string
	// Listen is the client address, host:port; default DefaultListen. Port
	// 0 picks a free port (tests).
	Listen string
	// Name is the server's name, unique among storage nodes; default: the
	// hostname when clustered, else "edgeplane".
	Name string

	// ClusterListen, if set, makes this node one storage node of a
	// JetStream cluster, accepting routes on this host:port. A data dir
	// holding a single box's store is refused then (CheckClusterable).
	ClusterListen string
	// ClusterName is the JetStream cluster's name, the same on every
	// storage node; default "edgeplane".
	ClusterName string
	// Routes are seed peers' cluster addresses, host:port (may include
	// this node's own).
	Routes []string

	// Auth says whether every connection needs credentials; default
	// AuthAuto (required when any listener is not loopback).
	Auth AuthMode
	// AuthDir holds the operator and account keys and the cluster secret,
	// created on first use; every storage node of a cluster needs a copy.
	// Default DataDir/auth.
	AuthDir string

	// TLS says whether a node requiring credentials speaks TLS: on the
	// client port from the first byte, and mutual TLS on cluster routes,
	// both under the auth dir's fleet CA. Default ToggleAuto.
	TLS Toggle
	// Encrypt says whether a node requiring credentials encrypts its
	// JetStream store at rest, with its store key. Default ToggleAuto.
	Encrypt Toggle
	// StoreKeyFile is the store key's file; default: systemd's
	// credential jetstream.key, else the auth dir's jetstream.key if
	// there is one, else DefaultStoreKeyFile (LocateStoreKey).
	StoreKeyFile string
	// TLSNames are names and addresses the node's certificate lists
	// besides its listeners' (a DNS name or load balancer clients use).
	TLSNames []string
	// TLSCertFile and TLSKeyFile, if set, are the node's certificate from
	// an operator's PKI instead of one it issues itself.
	TLSCertFile, TLSKeyFile string
	// CertTTL is the life of the certificate the node issues itself;
	// default pki.ServerTTL, renewed by the node at two thirds of it.
	CertTTL time.Duration
	// CertRenewCheck is how often the node looks at its certificate;
	// default as TLSConfig.RenewCheck.
	CertRenewCheck time.Duration

	// SyncInterval is Config.SyncInterval: zero, the default, syncs every
	// write before it is acknowledged.
	SyncInterval time.Duration

	// Names scope every stream and bucket; an empty field is its default
	// (store.NewNames).
	Names store.Names
	// Replicas of every stream and bucket when first created; default 1,
	// or 3 when clustered. Existing ones keep theirs.
	Replicas int

	// ClientName names this node's own connection in server monitoring;
	// default "control server".
	ClientName string
	// Progress receives the lines a person starting the node wants to see
	// (where it listens, its credentials, provisioning); nil discards them.
	Progress io.Writer
	// Logger receives warnings of the running node (revocations it could
	// not apply); nil discards them.
	Logger *zap.Logger
	// NATSLogger, if set, receives nats-server's own log lines; nil keeps
	// the server quiet.
	NATSLogger *zap.Logger
	// StartTimeout bounds the wait for JetStream and for provisioning (in a
	// cluster, for enough storage nodes to have joined); default
	// DefaultStartTimeout.
	StartTimeout time.Duration
}

// DefaultStartTimeout is how long Boot and Attach wait for JetStream and
// the store: a cluster's nodes are started one by one, by hand.
const DefaultStartTimeout = 2 * time.Minute

// Node is a running storage node, or with Attach a binding to storage nodes
// this process does not run.
type Node struct {
	// Server is the embedded nats-server; nil after Attach.
	Server *server.Server
	// Conn is this process's own connection; Store is bound on it.
	Conn  *nats.Conn
	Store *store.Store
	// Auth is the node's key material when it requires credentials, else
	// nil.
	Auth *Auth
	// CredsFile is the credentials Conn connected with: the control
	// credentials Boot wrote, or the file Attach was given; "" when none.
	CredsFile string
	// TLS is the node's TLS when it speaks it, else nil.
	TLS *TLSConfig

	stops []func()
}

// Close stops what Boot or Attach started, in reverse order: the
// revocation watch and status responder, the connection, the server, the
// data dir lock. Calling it again does nothing.
func (n *Node) Close() {
	for i := len(n.stops) - 1; i >= 0; i-- {
		n.stops[i]()
	}
	n.stops = nil
}

// Boot starts this box's storage node: it locks the data dir, resolves
// cfg.Auth and, when credentials are required, loads (or creates) the auth
// dir and keeps control credentials in DataDir/control.creds (new ones only when those no longer serve); it
// starts the embedded server (clustered when cfg.ClusterListen is set),
// connects, waits for JetStream, and provisions the store (or, on a
// clustered node that is not the meta leader, binds to it), retrying until
// enough storage nodes have joined (cfg.StartTimeout). The node then
// answers the storage status subject and applies revocations until ctx
// ends or Close: ctx is the node's life, not only its start-up, and Close
// is still needed to stop the server.
//
// Errors are structured (store.Error) where an operator can act on them: a
// data dir in use, a single box's store in a cluster, a listener that would
// expose the store without credentials.
func Boot(ctx context.Context, cfg BootConfig) (_ *Node, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("starting a storage node: a data dir is required")
	}
	mode, err := ParseAuthMode(string(cfg.Auth))
	if err != nil {
		return nil, err
	}
	tlsMode, err := ParseToggle("tls", string(cfg.TLS))
	if err != nil {
		return nil, err
	}
	encryptMode, err := ParseToggle("encrypt", string(cfg.Encrypt))
	if err != nil {
		return nil, err
	}
	names, err := store.NewNames(cfg.Names.Installation, cfg.Names.Authority)
	if err != nil {
		return nil, store.Errorf(store.CodeInvalid, "starting a storage node: %w", err)
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	authDir := cfg.AuthDir
	if authDir == "" {
		authDir = filepath.Join(cfg.DataDir, "auth")
	}
	clusterName := cfg.ClusterName
	if clusterName == "" {
		clusterName = "edgeplane"
	}
	progress := orDiscard(cfg.Progress)
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}

	n := &Node{}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	release, err := LockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n.stops = append(n.stops, release)
	clustered := cfg.ClusterListen != ""
	if clustered {
		if err := CheckClusterable(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	sc := Config{DataDir: cfg.DataDir, Listen: listen, Logger: cfg.NATSLogger, ServerName: cfg.Name, SyncInterval: cfg.SyncInterval}
	if mode.Required(listen, cfg.ClusterListen) {
		keyPlace := LocateStoreKey(cfg.DataDir, authDir, cfg.StoreKeyFile)
		newAuth := !exists(filepath.Join(authDir, authAccountSeed))
		// A new auth dir comes with a store key, in the auth dir only when
		// that is where the node looks for it.
		a, err := loadAuth(authDir, true, keyPlace.File == filepath.Join(authDir, authStoreKeyFile))
		if err != nil {
			return nil, err
		}
		if newAuth && keyPlace.Source != "systemd credential" && encryptMode != ToggleOff {
			if _, err := InitStoreKeyFile(keyPlace.File); err != nil {
				return nil, err
			}
		}
		if a.StoreKey, err = readStoreKeyFile(keyPlace.File); err != nil {
			return nil, err
		}
		if keyPlace.Warning != "" && a.StoreKey != "" && encryptMode != ToggleOff {
			fmt.Fprintf(progress, "WARNING: %s\n", keyPlace.Warning)
			logger.Warn("store key inside the data dir", zap.String("key", keyPlace.File), zap.String("data", cfg.DataDir))
		}
		sc.Auth, n.Auth = a, a
		switch {
		case tlsMode == ToggleOff:
			fmt.Fprintf(progress, "WARNING: TLS is off (--tls off): credentials, intent and certificates' private keys cross the network in the clear\n")
		case a.TLS == nil && tlsMode == ToggleOn:
			return nil, store.Errorf(store.CodeNotFound, "--tls on, but auth dir %s holds no fleet CA: run `control tls init --auth-dir %s`, copy the dir to every storage node, then start them again", authDir, authDir).
				With("auth_dir", authDir)
		case a.TLS == nil:
			fmt.Fprintf(progress, "WARNING: auth dir %s holds no fleet CA, so this node speaks plaintext: credentials, intent and certificates' private keys cross the network in the clear. "+
				"Turn TLS on with `control tls init --auth-dir %s` (see the README, \"Turning TLS on\")\n", authDir, authDir)
		default:
			sc.TLS = &TLSConfig{Fleet: a.TLS, Names: cfg.TLSNames, CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile,
				CertTTL: cfg.CertTTL, RenewCheck: cfg.CertRenewCheck}
			n.TLS = sc.TLS
		}
		if sc.TLS == nil {
			// Neither the server nor the node's own credentials speak
			// TLS.
			a = a.withoutTLS()
			sc.Auth = a
		}
		encrypted := ""
		switch {
		case encryptMode == ToggleOff:
			fmt.Fprintf(progress, "WARNING: encryption at rest is off (--encrypt off): the store in %s holds certificates' private keys in the clear\n", cfg.DataDir)
		case a.StoreKey == "" && encryptMode == ToggleOn:
			return nil, store.Errorf(store.CodeNotFound, "--encrypt on, but there is no store key (looked for %s): run `control storage encrypt --data %s`, then start the node again", keyPlace.File, cfg.DataDir).
				With("auth_dir", authDir).With("store_key", keyPlace.File)
		case a.StoreKey == "":
			fmt.Fprintf(progress, "WARNING: auth dir %s holds no store key, so the store in %s is not encrypted at rest: it holds certificates' private keys. "+
				"Turn encryption on with `control storage encrypt --data %s` (the key goes to %s)\n", authDir, cfg.DataDir, cfg.DataDir, DefaultStoreKeyFile(cfg.DataDir, authDir))
		default:
			sc.StoreKey = a.StoreKey
		}
		if sc.StoreKey == "" {
			if l, err := ReadStoreLayout(cfg.DataDir); err == nil && l.Encrypted {
				return nil, store.Errorf(store.CodeInvalid, "the store in %s is encrypted at rest, and this start has no store key (give the auth dir it was written with, without --encrypt off)", cfg.DataDir).
					With("data", cfg.DataDir)
			}
		} else {
			if err := checkStoreKey(cfg.DataDir, sc.StoreKey); err != nil {
				return nil, err
			}
			encrypted = fmt.Sprintf("store encrypted at rest (ChaCha20-Poly1305; key in %s (%s), which this node needs to read its own store)\n", keyPlace.File, keyPlace.Source)
		}
		// In this node's own data dir (the auth dir may be shared), kept
		// across starts, written whole before anyone reads it.
		n.CredsFile = filepath.Join(cfg.DataDir, ControlCredsFile)
		minted, err := a.keepControlCreds(n.CredsFile, names)
		if err != nil {
			return nil, fmt.Errorf("writing control credentials: %w", err)
		}
		fmt.Fprintf(progress, "credentials required on every connection; this node's control credentials: %s\n", n.CredsFile)
		if minted != "" {
			fmt.Fprintf(progress, "new control credentials (those before: %s)\n", minted)
		} else {
			fmt.Fprintf(progress, "control credentials kept from the last start\n")
		}
		fmt.Fprint(progress, encrypted)
	}
	layout := store.Layout{Replicas: cfg.Replicas}
	if clustered {
		if sc.ServerName == "" {
			sc.ServerName = store.HostName("edgeplane")
		}
		sc.Cluster = &ClusterConfig{Name: clusterName, Listen: cfg.ClusterListen, Routes: cfg.Routes}
		if sc.Auth != nil {
			sc.Cluster.Secret = sc.Auth.ClusterSecret
		}
		if layout.Replicas == 0 {
			layout.Replicas = 3
		}
	}
	ns, err := Start(sc)
	if err != nil {
		return nil, err
	}
	n.Server = ns
	n.stops = append(n.stops, func() { ns.Shutdown(); ns.WaitForShutdown() })
	fmt.Fprintf(progress, "embedded NATS with JetStream on %s (store %s)\n", ns.ClientURL(), filepath.Join(cfg.DataDir, "jetstream"))
	switch {
	case sc.TLS != nil:
		leaf := sc.TLS.Leaf()
		how := "issued by this node, renewed at two thirds of its life"
		if cfg.TLSCertFile != "" {
			how = "from " + cfg.TLSCertFile + ", read again when it changes"
		}
		routes := ""
		if clustered {
			routes = " and mutual TLS on routes"
		}
		fmt.Fprintf(progress, "TLS required on the client port (from the first byte)%s; certificate for %s valid until %s (%s); fleet CA %s\n",
			routes, strings.Join(certNamesOf(leaf), ","),
			leaf.NotAfter.UTC().Format(time.RFC3339), how, pki.Fingerprint(sc.TLS.Fleet.CA.Cert))
	case sc.Auth == nil:
		fmt.Fprintf(progress, "plaintext on loopback, no credentials: this store is reachable from this box only\n")
	}
	if clustered {
		fmt.Fprintf(progress, "storage node %s of cluster %s: routes on %s, seeds %s\n", ns.Name(), clusterName,
			cfg.ClusterListen, strings.Join(cfg.Routes, ","))
	}

	wctx, cancel := context.WithTimeout(ctx, orDefault(cfg.StartTimeout, DefaultStartTimeout))
	defer cancel()
	if err := n.connect(wctx, store.ConnectOptions{URL: ns.ClientURL(), CredsFile: n.CredsFile, Name: cfg.ClientName, OwnServer: true}); err != nil {
		return nil, err
	}
	// Concurrent creates of one stream from several nodes can go
	// unanswered: in a cluster the meta leader provisions and the others
	// bind once it is done (and take over if it dies first: leadership
	// moves).
	bindOnly := func() bool { return clustered && !ns.JetStreamIsLeader() }
	if n.Store, err = provision(wctx, n.Conn, names, layout, progress, bindOnly); err != nil {
		return nil, err
	}

	if n.Auth != nil {
		// Credentials kept from the last start may have been revoked
		// since: the node would apply that to its own connection.
		revoked, err := controlCredsRevoked(wctx, n.Store, n.CredsFile)
		if err != nil {
			return nil, err
		}
		if revoked {
			fmt.Fprintf(progress, "this node's control credentials in %s were revoked: new ones\n", n.CredsFile)
			if err := n.Auth.WriteCredsFile(n.CredsFile, CredsRequest{Role: RoleControl, Names: names, Name: controlCredsName}); err != nil {
				return nil, fmt.Errorf("writing control credentials: %w", err)
			}
			n.Conn.Close()
			if err := n.connect(wctx, store.ConnectOptions{URL: ns.ClientURL(), CredsFile: n.CredsFile, Name: cfg.ClientName, OwnServer: true}); err != nil {
				return nil, err
			}
			if n.Store, err = provision(wctx, n.Conn, names, layout, progress, bindOnly); err != nil {
				return nil, err
			}
		}
	}

	stop, err := ServeStatus(ctx, n.Conn, names, ns)
	if err != nil {
		return nil, err
	}
	n.stops = append(n.stops, stop)
	if n.Auth != nil {
		// Revoked credentials are refused here from the bucket's history
		// on, and their connections closed as revocations arrive.
		stop, err := WatchRevocations(ctx, n.Store, ns, n.Auth, func(err error) {
			logger.Warn("applying revocations", zap.Error(err))
		})
		if err != nil {
			return nil, err
		}
		n.stops = append(n.stops, stop)
	}
	return n, nil
}

// connect makes n's connection with o, reconnecting for as long as the
// node runs, and waits until JetStream answers on it.
func (n *Node) connect(ctx context.Context, o store.ConnectOptions) error {
	if o.Name == "" {
		o.Name = "control server"
	}
	o.ReconnectForever = true
	nc, err := store.Connect(o)
	if err != nil {
		return err
	}
	n.Conn = nc
	n.stops = append(n.stops, nc.Close)
	return store.WaitForJetStream(ctx, nc)
}

// provision provisions the store with layout, or binds to it while
// bindOnly (nil: never) says another node provisions, retrying until ctx
// ends: in a cluster, stream placement needs enough storage nodes to have
// joined, and provisioning is idempotent.
func provision(ctx context.Context, nc *nats.Conn, names store.Names, layout store.Layout, progress io.Writer, bindOnly func() bool) (*store.Store, error) {
	// A store whose floor is above this release is left as it is:
	// provisioning would put its streams and buckets back to this
	// release's layout under the processes that raised it.
	if open, err := store.Open(ctx, nc, names); err == nil {
		if err := open.CheckFloor(ctx, "control"); store.HasCode(err, store.CodeTooOld) {
			return nil, err
		}
	}
	var s *store.Store
	last := time.Now()
	err := retry(ctx, func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if bindOnly != nil && bindOnly() {
			s, err = store.Bind(pctx, nc, names)
		} else {
			s, err = store.Provision(pctx, nc, names, layout)
		}
		if err != nil && time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Fprintf(progress, "waiting for enough storage nodes to place %d replicas: %v\n", layout.Replicas, err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r := layout.Replicas
	if r == 0 {
		r = 1 // store.Provision's default
	}
	fmt.Fprintf(progress, "provisioned streams and buckets for installation %s, authority %s (replicas %d)\n", names.Installation, names.Authority, r)
	return s, nil
}

// retry runs f until it succeeds or ctx ends, returning the last error.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// controlCredsRevoked reports whether the user of the credentials in file
// is in s's revocations.
func controlCredsRevoked(ctx context.Context, s *store.Store, file string) (bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return false, fmt.Errorf("control credentials: %w", err)
	}
	who, err := store.UserOfCreds(b)
	if err != nil {
		return false, err
	}
	return s.UserRevoked(ctx, who.User)
}
