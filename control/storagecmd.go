package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// clusterFlags are `control server`'s storage and cluster flags.
type clusterFlags struct {
	name, clusterName, clusterListen, routes string
	authMode, authDir                        string
	storage                                  bool
	replicas                                 int
	tlsMode, tlsNames, tlsCert, tlsKey       string
	certTTL                                  time.Duration
	encrypt, storeKey                        string
	sync                                     string
}

func addClusterFlags(fs *flag.FlagSet) *clusterFlags {
	c := &clusterFlags{}
	fs.BoolVar(&c.storage, "storage", true, "host the replicated store (a storage node); false: a client of --nats that holds no replicated state")
	fs.StringVar(&c.name, "name", "", "server name, unique among storage nodes (default: the hostname when clustered, else \"edgeplane\")")
	fs.StringVar(&c.clusterName, "cluster-name", "edgeplane", "JetStream cluster name; the same on every storage node")
	fs.StringVar(&c.clusterListen, "cluster-listen", "", "cluster route address host:port; set it to run as a storage node of a cluster")
	fs.StringVar(&c.routes, "routes", "", "comma-separated seed peers' cluster addresses host:port (may include this node)")
	fs.IntVar(&c.replicas, "replicas", 0, "replicas of every stream and bucket when first created (default 1, or 3 when clustered); change later with 'control storage add|remove'")
	fs.StringVar(&c.authMode, "auth", "auto", "require credentials: on, off, or auto (on when any listener is not loopback)")
	fs.StringVar(&c.authDir, "auth-dir", "", "operator and account keys, the cluster secret and the fleet CA (default DATA/auth; copy it to every storage node)")
	fs.StringVar(&c.tlsMode, "tls", "auto", "with credentials, TLS on the client port (from the first byte) and mutual TLS on routes: on, off, or auto (on when the auth dir holds the fleet CA)")
	fs.StringVar(&c.tlsNames, "tls-names", "", "comma-separated names and addresses this node's certificate lists besides its listeners' (a DNS name or load balancer clients use)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "this node's certificate `FILE` from your own PKI (chaining to the auth dir's bundle), instead of one it issues itself; read again when it changes")
	fs.StringVar(&c.tlsKey, "tls-key", "", "the key `FILE` of --tls-cert")
	fs.DurationVar(&c.certTTL, "cert-ttl", pki.ServerTTL, "life of the certificate this node issues itself; renewed in place at two thirds of it")
	fs.StringVar(&c.encrypt, "encrypt", "auto", "with credentials, encrypt the JetStream store at rest with the store key: on, off, or auto (on when there is a key)")
	fs.StringVar(&c.storeKey, "store-key", "", "`FILE` of the key the store is encrypted with at rest (default: systemd's credential jetstream.key, else AUTH/jetstream.key if there is one, else DATA-keys/jetstream.key, outside the data dir)")
	fs.StringVar(&c.sync, "sync", storagenode.SyncAlways, "when the store syncs a write to disk: always (before acknowledging it), or an interval such as 2m (faster; a power cut loses what was acknowledged since the last sync)")
	return c
}

// start brings up this box's side of the store: an embedded storage node
// (alone or clustered), or a client of external/other storage nodes.
func (c *clusterFlags) start(ctx context.Context, stdout io.Writer, logger *zap.Logger, data, listen, external, creds, caFile string, natsLogger *zap.Logger, names store.Names) (*storagenode.Node, error) {
	syncInterval, err := storagenode.ParseSync(c.sync)
	if err != nil {
		return nil, usagef("--sync %q: want always (every write synced before it is acknowledged) or a positive interval such as 2m", c.sync)
	}
	if external != "" {
		if syncInterval != 0 {
			return nil, usagef("--sync applies to the storage node this server runs; with --nats the storage nodes' own --sync decides")
		}
		return storagenode.Attach(ctx, storagenode.AttachConfig{URL: external, CredsFile: creds, CAFile: caFile, Names: names,
			Provision: c.storage, Replicas: c.replicas, Progress: stdout})
	}
	if !c.storage {
		return nil, usagef("--storage=false holds no replicated state: give --nats URL of the storage nodes")
	}
	mode, err := storagenode.ParseAuthMode(c.authMode)
	if err != nil {
		return nil, usagef("--auth %q: want on, off or auto", c.authMode)
	}
	tlsMode, err := storagenode.ParseToggle("tls", c.tlsMode)
	if err != nil {
		return nil, usagef("--tls %q: want on, off or auto", c.tlsMode)
	}
	encrypt, err := storagenode.ParseToggle("encrypt", c.encrypt)
	if err != nil {
		return nil, usagef("--encrypt %q: want on, off or auto", c.encrypt)
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	return storagenode.Boot(ctx, storagenode.BootConfig{
		DataDir: data, Listen: listen, Name: c.name,
		ClusterListen: c.clusterListen, ClusterName: c.clusterName, Routes: splitList(c.routes),
		Auth: mode, AuthDir: c.authDir,
		TLS: tlsMode, TLSNames: splitList(c.tlsNames), TLSCertFile: c.tlsCert, TLSKeyFile: c.tlsKey, CertTTL: c.certTTL, Encrypt: encrypt, StoreKeyFile: c.storeKey,
		Names: names, Replicas: c.replicas, SyncInterval: syncInterval,
		Progress: stdout, Logger: logger, NATSLogger: natsLogger,
	})
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// storageFlags are flags several storage commands share.
type storageFlags struct {
	wait, catchup time.Duration
}

func addStorageFlags(fs *flag.FlagSet, catchup bool) *storageFlags {
	f := &storageFlags{}
	fs.DurationVar(&f.wait, "wait", time.Second, "how long storage nodes have to answer the status request")
	if catchup {
		fs.DurationVar(&f.catchup, "catchup-timeout", 2*time.Minute, "how long JetStream has to place new replicas and catch them up")
	}
	return f
}

// withView binds to the store for as long as fn runs, with the storage
// nodes' views and the replica placement. A command that changes placement
// (change) is refused without write quorum.
func (f *storageFlags) withView(c *call, change bool, fn func(*store.Store, *storage.View) error) error {
	return c.withStore(func(s *store.Store) error {
		view, err := storage.Read(c.ctx, s, f.wait)
		if err != nil {
			return err
		}
		if change {
			if err := view.RequireQuorum(); err != nil {
				return err
			}
		}
		return fn(s, view)
	})
}

func setupStorageList(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, false)
	return func(c *call) error {
		return f.withView(c, false, func(_ *store.Store, view *storage.View) error {
			return c.out.emit(view, func(w io.Writer) { printers.Storage(w, view) })
		})
	}
}

func setupStorageCheck(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, false)
	return func(c *call) error {
		return f.withView(c, false, func(_ *store.Store, view *storage.View) error {
			rep := storage.Check(view)
			if err := c.out.emit(rep, func(w io.Writer) { printers.StorageCheck(w, rep) }); err != nil {
				return err
			}
			return rep.Err()
		})
	}
}

func setupStorageAdd(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, true)
	maxR := fs.Int("max-replicas", 5, "the replica count never grows beyond this")
	return func(c *call) error {
		return f.withView(c, true, func(s *store.Store, view *storage.View) error {
			p, err := storage.PlanAdd(view, c.args[0], *maxR)
			if err != nil {
				return err
			}
			if !p.Grows() {
				return c.out.emit(map[string]any{"node": p.Node, "replicas": p.From, "changed": false}, func(w io.Writer) {
					fmt.Fprintf(w, "storage node %s is a current cluster member; replicas stay at %d (an odd count of at most %d), so it holds no replicas yet: add another node to grow to %d\n",
						p.Node, p.From, p.MaxReplicas, p.From+2)
				})
			}
			pl, err := storage.Add(c.ctx, s, p, f.catchup, c.out.w)
			if err != nil {
				return err
			}
			return c.out.emit(map[string]any{"node": p.Node, "replicas": p.To, "changed": true, "placement": pl}, func(w io.Writer) {
				fmt.Fprintf(w, "storage node %s added: %d streams and buckets at %d replicas, all caught up\n", p.Node, len(pl), p.To)
			})
		})
	}
}

func setupStorageRemove(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, true)
	return func(c *call) error {
		return f.withView(c, true, func(s *store.Store, view *storage.View) error {
			p, err := storage.PlanRemove(view, c.args[0])
			if err != nil {
				return err
			}
			pl, err := storage.Remove(c.ctx, s, p, f.catchup, c.out.w)
			if err != nil {
				return err
			}
			return c.out.emit(map[string]any{"node": p.Node, "replicas": p.To, "placement": pl}, func(w io.Writer) {
				fmt.Fprintf(w, "storage node %s removed from every stream and bucket (replicas %d); stop its `control server` now, "+
					"then `control storage forget %s` takes it out of the JetStream meta group (or start it again and `storage add` it). "+
					"It keeps a copy of the store in its data dir: treat that like a backup (it holds private keys).\n", p.Node, p.To, p.Node)
			})
		})
	}
}

func setupStorageEncrypt(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "the storage node's data dir (its auth dir is DATA/auth; the key goes outside it, to DATA-keys/jetstream.key)")
	authDirFlag := fs.String("auth-dir", "", "auth dir (overrides DATA/auth; without --data the key goes into it)")
	keyFile := fs.String("store-key", "", "`FILE` to keep the key in (then start the node with --store-key FILE)")
	return func(c *call) error {
		authDir := *authDirFlag
		if authDir == "" {
			if *data == "" {
				return usagef("--data DIR or --auth-dir DIR is required (run this on a storage node)")
			}
			authDir = filepath.Join(*data, "auth")
		}
		if _, err := storagenode.LoadAuth(authDir, false); err != nil {
			return err
		}
		place := storagenode.LocateStoreKey(*data, authDir, *keyFile)
		if *data == "" && *keyFile == "" && place.Source == "default" {
			place.File = filepath.Join(authDir, storagenode.StoreKeyCredential)
		}
		if place.Source == "systemd credential" {
			fmt.Fprintf(c.stdout, "store key from systemd's credential %s\n", place.File)
			return nil
		}
		if _, err := storagenode.InitStoreKeyFile(place.File); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "store key in %s\n", place.File)
		if place.Warning != "" {
			fmt.Fprintf(c.stdout, "WARNING: %s\n", place.Warning)
		}
		fmt.Fprintln(c.stdout, "next: restart the storage nodes one at a time: each encrypts its store as it starts, with the key it finds (--store-key, "+
			"systemd's credential jetstream.key, AUTH/jetstream.key, or DATA-keys/jetstream.key). Keep the key off the data dir and its backups: "+
			"a store encrypted with it opens with it only")
		return nil
	}
}

func setupStorageUpgrade(fs *flag.FlagSet) func(*call) error {
	var o storage.UpgradeOptions
	fs.DurationVar(&o.HealthBound, "health-bound", storage.DefaultNodeHealthBound, "how long each node's new release has to rejoin, see write quorum and catch up on every replica it holds, before it rolls itself back")
	fs.DurationVar(&o.Settle, "settle", 2*time.Minute, "how long the cluster has to be healthy before each node (every node answering, no replica lagging), and its stream leaders to move off it")
	fs.BoolVar(&o.AllowDowngrade, "allow-downgrade", false, "let storage nodes move to a release older than the one they run")
	nodes := fs.String("nodes", "", "only these storage nodes, comma-separated (default: every node)")
	return func(c *call) error {
		o.Release, o.Nodes = c.args[0], splitList(*nodes)
		o.Progress = printers.StorageUpgradeProgress(c.stdout, c.out.json)
		return c.withStore(func(s *store.Store) error {
			res, err := storage.Upgrade(c.ctx, s, o)
			if res != nil {
				err = cmp.Or(c.out.emit(res, func(w io.Writer) { printers.StorageUpgrade(w, res) }), err)
			}
			return err
		})
	}
}
