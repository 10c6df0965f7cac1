// Package storagenode runs a storage node: the embedded nats-server with
// JetStream that holds the edgeplane store, alone on one box or as one node of
// a RAFT-replicated JetStream cluster, with operator-mode credentials, the
// revocation list, the storage status it answers and the import of a single
// box's store into a cluster.
//
// Boot starts a whole storage node as `control server` runs it (data dir
// lock, credentials, clustering, provisioning, status, revocations), syncing
// every write before it is acknowledged unless told an interval
// (Config.SyncInterval, `--sync`); Start
// is the bare server beneath it, for tests and the import's private
// server. Attach binds a process to storage nodes it does not run.
//
// Start reads every message block of the store before the server opens
// it (CheckStore), because the server itself would start over a damaged
// block with a silent hole: a single box with a damaged block refuses to
// start, naming the file and the backup to restore; a node of a cluster
// sets the damaged stream's copy aside (QuarantineDir) and RAFT rebuilds
// it from the stream's leader, and its status says so (RebuiltStreams).
//
// Only `control server` and the storage commands of `control` run a storage
// node, so only they link nats-server: the gateway, edgeplane-dns and meshd
// are clients of package store alone.
package storagenode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// DefaultListen is where an embedded server listens unless told otherwise.
const DefaultListen = "127.0.0.1:4222"

// Config configures an in-process nats-server with JetStream.
type Config struct {
	// DataDir holds the JetStream store under DataDir/jetstream.
	DataDir string
	// Listen is the client address, host:port; default DefaultListen. Port 0
	// picks a free port (tests).
	Listen string
	// ServerName names the server in a cluster; default "edgeplane".
	ServerName string
	// Logger, if set, receives nats-server's own log lines (notices at
	// Info); nil keeps the server quiet.
	Logger *zap.Logger
	// Configure, if set, may adjust the options before the server starts
	// (cluster routes, accounts).
	Configure func(*server.Options) error

	// Cluster, if set, makes this server one storage node of a JetStream
	// cluster (RAFT-replicated streams and KV).
	Cluster *ClusterConfig
	// Auth, if set, runs the server in operator mode: every client needs a
	// credentials file issued by Auth (see auth.go). It is required when
	// Listen is not a loopback address.
	Auth *Auth
	// StoreKey, if set, encrypts the JetStream store at rest
	// (ChaCha20-Poly1305); a store written with a key opens with that key
	// only, and a plaintext one is encrypted as the server starts.
	StoreKey string
	// TLS makes the client port require TLS from the first byte and
	// cluster routes mutual TLS under the fleet CA. It needs Auth: TLS
	// protects credentials, and a store without any has none to protect
	// (it listens on loopback only). Default: TLS with the defaults of
	// TLSConfig when Auth holds a fleet CA (the credentials it issues
	// carry the CA, so their holders speak TLS), none otherwise.
	TLS *TLSConfig
	// SyncInterval, if set, lets the store acknowledge a write before it
	// reaches the disk and syncs every SyncInterval instead (nats-server's
	// own default is 2 minutes): a power cut then loses what was
	// acknowledged since the last sync. Zero, the default, syncs every
	// write before it is acknowledged (nats-server's SyncAlways): in a
	// replicated stream, every node syncs the write to its RAFT log before
	// it counts towards the quorum the acknowledgement waits for. The
	// streams provisioned with async persistence (store.DurabilityRewritten
	// on a single node) sync every SyncInterval, or every 2 minutes with
	// the default.
	SyncInterval time.Duration
	// MaxStore is how much JetStream may store on this node. Zero, the
	// default: what nats-server derives (three quarters of the disk free
	// at start), with store.ReservedBytes added when that is less than
	// the reservation (see storeLimit).
	MaxStore int64
	// ReadyTimeout bounds the wait for the server to accept connections,
	// which includes recovering its JetStream store; default
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// SyncAlways is the sync policy that syncs every write before the store
// acknowledges it (a SyncInterval of zero), as a flag spells it.
const SyncAlways = "always"

// ParseSync reads a sync policy as `control server --sync` takes it:
// SyncAlways, or the interval JetStream syncs at instead (a duration), and
// returns the SyncInterval it is.
func ParseSync(s string) (time.Duration, error) {
	if s == SyncAlways || s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, store.Errorf(store.CodeInvalid, "--sync %q: want %q (every write synced before it is acknowledged) or a positive interval such as 2m", s, SyncAlways).
			With("sync", s)
	}
	return d, nil
}

// ProfileEnv names the environment variable that, set to a port, makes a
// storage node serve Go's profiles (/debug/pprof/: heap, CPU, goroutines)
// at that port of its listen host, a loopback address only: what a
// benchmark reads a node's own memory and CPU by (control/fleetsim/bench).
const ProfileEnv = "EDGEPLANE_STORAGE_PROFILE_PORT"

// DefaultReadyTimeout is how long a storage node may take to accept
// connections: a box with a large store recovers it first, and a busy
// machine is slow to schedule a new server.
const DefaultReadyTimeout = time.Minute

// Start starts a nats-server with JetStream and waits until it
// accepts connections.
func Start(cfg Config) (*server.Server, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("starting embedded nats: a data dir is required")
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats: listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats: listen port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := cfg.ServerName
	if name == "" {
		name = "edgeplane"
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		NoSigs:     true,
		NoLog:      cfg.Logger == nil,
		// Routing projections and certificate records can exceed the 1 MiB
		// default payload limit in large installations.
		MaxPayload: 8 << 20,
	}
	limit, err := storeLimit(cfg.MaxStore, opts.StoreDir, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats: %w", err)
	}
	opts.JetStreamMaxStore = limit
	if cfg.SyncInterval > 0 {
		opts.SyncInterval = cfg.SyncInterval
	} else {
		opts.SyncAlways = true
	}
	if cfg.StoreKey != "" {
		opts.JetStreamKey, opts.JetStreamCipher = cfg.StoreKey, server.ChaCha
	}
	if err := checkListeners(listen, cfg.Cluster, cfg.Auth); err != nil {
		return nil, fmt.Errorf("starting embedded nats: %w", err)
	}
	if cfg.Cluster != nil {
		if err := cfg.Cluster.configure(opts); err != nil {
			return nil, fmt.Errorf("starting embedded nats: %w", err)
		}
	}
	if cfg.Auth != nil {
		if err := cfg.Auth.configure(opts); err != nil {
			return nil, fmt.Errorf("starting embedded nats: %w", err)
		}
	}
	if cfg.TLS == nil && cfg.Auth != nil && cfg.Auth.TLS != nil {
		cfg.TLS = &TLSConfig{Fleet: cfg.Auth.TLS}
	}
	if cfg.TLS != nil {
		if cfg.Auth == nil {
			return nil, fmt.Errorf("starting embedded nats: TLS without credentials: give the node an auth dir")
		}
		if err := cfg.TLS.configure(opts, cfg.Logger); err != nil {
			return nil, fmt.Errorf("starting embedded nats: %w", err)
		}
	}
	if port := os.Getenv(ProfileEnv); port != "" {
		if opts.ProfPort, err = strconv.Atoi(port); err != nil || opts.ProfPort <= 0 {
			return nil, fmt.Errorf("starting embedded nats: $%s %q: want a port number", ProfileEnv, port)
		}
		// nats-server serves them on the client listener's host: never
		// to another box.
		if !IsLoopback(host) {
			return nil, fmt.Errorf("starting embedded nats: $%s serves profiles on %s, which is not a loopback address: unset it", ProfileEnv, host)
		}
	}
	if cfg.Configure != nil {
		if err := cfg.Configure(opts); err != nil {
			return nil, fmt.Errorf("starting embedded nats: %w", err)
		}
	}
	// Before the server opens the store: it would truncate a damaged block
	// and start with the hole (corruption.go).
	if err := guardStore(cfg); err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats: %w", err)
	}
	// The server reports a listener it cannot open (a port taken) only
	// through its logger's Fatalf, and then never becomes ready: the
	// logger is always set, so that Start fails at once and says why.
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	nl := natsLogger{s: logger.WithOptions(zap.AddCallerSkip(1)).Sugar(), fatal: make(chan string, 1)}
	ns.SetLogger(nl, false, false)
	go ns.Start()
	wait := cfg.ReadyTimeout
	if wait <= 0 {
		wait = DefaultReadyTimeout
	}
	for deadline := time.Now().Add(wait); !ns.ReadyForConnections(readyPoll); {
		select {
		case msg := <-nl.fatal:
			ns.Shutdown()
			return nil, fmt.Errorf("starting embedded nats on %s: %w: %s", listen, ErrCannotStart, msg)
		default:
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return nil, fmt.Errorf("starting embedded nats on %s: not ready after %s", listen, wait)
		}
	}
	if cfg.TLS != nil {
		cfg.TLS.renewWhile(ns)
	}
	return ns, nil
}

// ErrCannotStart is the error of a storage node whose server gave up
// starting (a listener it could not open): retrying on other ports may
// succeed, retrying as it is will not.
var ErrCannotStart = errors.New("the server cannot start")

// readyPoll is how often Start looks for a failure while it waits for
// the server to become ready.
const readyPoll = 100 * time.Millisecond

// natsLogger is nats-server's logger interface over zap, so a storage node
// logs through its process's one logger. fatal gets the first fatal
// message.
type natsLogger struct {
	s     *zap.SugaredLogger
	fatal chan string
}

func (l natsLogger) Noticef(format string, v ...any) { l.s.Infof(format, v...) }
func (l natsLogger) Warnf(format string, v ...any)   { l.s.Warnf(format, v...) }
func (l natsLogger) Errorf(format string, v ...any)  { l.s.Errorf(format, v...) }
func (l natsLogger) Debugf(format string, v ...any)  { l.s.Debugf(format, v...) }
func (l natsLogger) Tracef(format string, v ...any)  { l.s.Debugf(format, v...) }

// Fatalf is a failure the server cannot go on from; it shuts itself down
// after saying so, and the process decides whether to exit.
func (l natsLogger) Fatalf(format string, v ...any) {
	l.s.Errorf(format, v...)
	select {
	case l.fatal <- fmt.Sprintf(format, v...):
	default:
	}
}

// storeLimit is the JetStream storage limit a node starts with: max if set,
// else 0 (nats-server derives it from the free disk) unless three quarters
// of what is free falls short of store.ReservedBytes. JetStream reserves
// every stream's size limit whole at creation, so on a small disk (or a
// full one) Provision would be refused (storage_full) although the store
// holds a few megabytes: the node starts with the reservation plus what
// nats-server would have allowed as its limit instead (so streams and
// buckets beyond the store's own layout, an operator's or a test's, still
// find room), and says that a disk this small fills before the store's
// own limits are reached.
func storeLimit(max int64, dir string, logger *zap.Logger) (int64, error) {
	if max > 0 {
		return max, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("store dir: %w", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	reserved := store.ReservedBytes()
	if free/4*3 >= reserved {
		return 0, nil
	}
	if logger != nil {
		logger.Warn("the disk has less free space than the store's limits add up to: writes fail with the disk full before a stream's own limit refuses them",
			zap.String("store_dir", dir), zap.Int64("free_bytes", free), zap.Int64("limits_bytes", reserved))
	}
	return reserved + free/4*3, nil
}
