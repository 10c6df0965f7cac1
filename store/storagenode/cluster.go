package storagenode

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// Storage nodes are the `control server --storage` boxes: each runs an
// embedded nats-server with JetStream, and together they form one JetStream
// cluster whose streams and buckets are RAFT-replicated. Everything here is
// NATS's own clustering; edgeplane adds only the checks that make a lost
// quorum loud (RequireQuorum) and the explicit storage operations.

// RouteUser is the user name storage nodes authenticate their cluster
// routes with; the password is the cluster secret every node shares.
const RouteUser = "edgeplane-route"

// Route liveness between storage nodes (see ClusterConfig.configure).
const (
	RoutePingInterval = 2 * time.Second
	RouteMaxPingsOut  = 3
)

// ClusterConfig makes an embedded server one node of a JetStream cluster.
type ClusterConfig struct {
	// Name of the cluster; every storage node uses the same one.
	Name string
	// Listen is the cluster (route) address, host:port.
	Listen string
	// Routes are seed peers' cluster addresses, host:port. A node learns the
	// rest of the cluster from them.
	Routes []string
	// Secret authenticates routes. Required when Listen is not loopback.
	Secret string
}

func (c *ClusterConfig) configure(opts *server.Options) error {
	if c.Name == "" || !store.ValidToken(c.Name) {
		return fmt.Errorf("cluster name %q: letters, digits, '-' and '_' only", c.Name)
	}
	host, port, err := splitPort(c.Listen)
	if err != nil {
		return fmt.Errorf("cluster listen: %w", err)
	}
	opts.Cluster.Name = c.Name
	opts.Cluster.Host = host
	opts.Cluster.Port = port
	// A route to a node cut off silently (no RST, packets dropped) stays
	// up until its pings go unanswered: by default up to a minute and
	// more, during which the majority keeps routing requests (a bucket's
	// direct gets, answered by any replica) into the partition, where they
	// time out. Pinging every RoutePingInterval, a silent route is dropped
	// after RouteMaxPingsOut missed answers; a route carrying RAFT traffic
	// (heartbeats every second) sends no pings at all.
	opts.Cluster.PingInterval = RoutePingInterval
	opts.Cluster.MaxPingsOut = RouteMaxPingsOut
	if c.Secret != "" {
		opts.Cluster.Username = RouteUser
		opts.Cluster.Password = c.Secret
	}
	for _, r := range c.Routes {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		r = strings.TrimPrefix(r, "nats-route://")
		if _, _, err := net.SplitHostPort(r); err != nil {
			return fmt.Errorf("route %q: want host:port: %w", r, err)
		}
		u := &url.URL{Scheme: "nats-route", Host: r}
		if c.Secret != "" {
			u.User = url.UserPassword(RouteUser, c.Secret)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

func splitPort(hostport string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", hostport, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: bad port: %w", hostport, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// IsLoopback reports whether host (an IP or a name) only reaches this box.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkListeners refuses to expose the store without credentials: a client
// listener off loopback needs operator-mode auth, a cluster listener off
// loopback needs the route secret.
func checkListeners(listen string, c *ClusterConfig, a *Auth) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen %q: %w", listen, err)
	}
	if !IsLoopback(host) && a == nil {
		return &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("refusing to listen on %s without credentials: "+
			"a non-loopback listener requires --auth (every client then needs a credentials file from `control creds issue`)", listen),
			Detail: map[string]string{"listen": listen}}
	}
	if c != nil {
		ch, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("cluster listen %q: %w", c.Listen, err)
		}
		if !IsLoopback(ch) && c.Secret == "" {
			return &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("refusing to accept cluster routes on %s without the cluster secret: run with --auth "+
				"(the secret is in the auth dir every storage node shares)", c.Listen),
				Detail: map[string]string{"cluster_listen": c.Listen}}
		}
	}
	return nil
}

// LocalStatus reads ns's own view of the cluster and of its local
// stream replicas.
func LocalStatus(ns *server.Server) (*store.StorageNodeStatus, error) {
	st := &store.StorageNodeStatus{Version: store.RecordVersion, Server: ns.Name(), Cluster: ns.ClusterName(), Release: version.Version, At: time.Now().UTC()}
	if data := dataDirOf(ns); data != "" {
		// The trial a storage upgrade started, as the release dir
		// records it: read at every answer, so a rollback reads as one.
		if t, err := upgrade.ForData(data).Load(); err == nil && t != nil {
			st.Upgrade = &store.UpgradeStatus{Rollout: t.Rollout, Attempt: t.Attempt, From: t.From, To: t.To, State: t.State, Reason: t.Reason, At: t.At}
		}
	}
	if cfg := ns.JetStreamConfig(); cfg != nil {
		// The server keeps its files in DATA/jetstream/jetstream (Start
		// gives it DATA/jetstream); the layout is read from DATA.
		if l, err := ReadStoreLayout(filepath.Dir(filepath.Dir(cfg.StoreDir))); err == nil {
			st.EncryptedAtRest = l.Encrypted
		}
	}
	jsz, err := ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return nil, fmt.Errorf("reading jetstream status of %s: %w", ns.Name(), err)
	}
	if m := jsz.Meta; m != nil {
		st.MetaLeader, st.ClusterSize, st.QuorumNeeded = m.Leader, m.Size, m.QuorumNeeded
		if m.Leader != "" {
			// The meta group reports peers other than the leader; list the
			// leader too so a reader sees every member.
			st.Peers = append(st.Peers, store.StoragePeer{Name: m.Leader, Current: true})
		}
		for _, r := range m.Replicas {
			if r == nil || r.Name == m.Leader {
				continue
			}
			st.Peers = append(st.Peers, store.StoragePeer{Name: r.Name, Current: r.Current, Offline: r.Offline, Active: store.Duration(r.Active), Lag: r.Lag})
		}
		if !containsPeer(st.Peers, ns.Name()) {
			st.Peers = append(st.Peers, store.StoragePeer{Name: ns.Name(), Current: m.Leader != ""})
		}
	} else {
		st.ClusterSize, st.QuorumNeeded = 1, 1
		st.MetaLeader = ns.Name()
		st.Peers = []store.StoragePeer{{Name: ns.Name(), Current: true}}
	}
	sort.Slice(st.Peers, func(i, j int) bool { return st.Peers[i].Name < st.Peers[j].Name })
	rebuilt, err := RebuiltStreams(dataDirOf(ns))
	if err != nil {
		return nil, err
	}
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			r := store.StreamReplica{Name: sd.Name, Msgs: sd.State.Msgs, Bytes: sd.State.Bytes, FirstSeq: sd.State.FirstSeq, LastSeq: sd.State.LastSeq}
			if sd.Cluster != nil {
				r.Leader = sd.Cluster.Leader
			}
			if l := sd.State.Lost; l != nil {
				r.Lost, r.LostBytes = uint64(len(l.Msgs)), l.Bytes
			}
			for _, rb := range rebuilt {
				if rb.Stream == sd.Name {
					at := rb.At
					r.Rebuilt, r.Damage = &at, rb.Damage
				}
			}
			st.Streams = append(st.Streams, r)
		}
	}
	sort.Slice(st.Streams, func(i, j int) bool { return st.Streams[i].Name < st.Streams[j].Name })
	return st, nil
}

func containsPeer(ps []store.StoragePeer, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// ServeStatus answers the storage status subject with ns's own view until
// ctx ends or the returned stop is called.
func ServeStatus(ctx context.Context, nc *nats.Conn, names store.Names, ns *server.Server) (func(), error) {
	return store.ServeStorageStatus(ctx, nc, names, func() (*store.StorageNodeStatus, bool, error) {
		// Only a node's own view counts: after its server stopped, this
		// connection may have moved to another node and must stay silent.
		if !ns.Running() || nc.ConnectedServerName() != ns.Name() {
			return nil, false, nil
		}
		st, err := LocalStatus(ns)
		return st, true, err
	})
}
