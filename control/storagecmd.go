package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/signing/signers"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// clusterFlags are `control server`'s storage and cluster flags.
type clusterFlags struct {
	name, clusterName, clusterListen, routes string
	authMode, authDir                        string
	storage                                  bool
	replicas                                 int
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
	fs.StringVar(&c.authDir, "auth-dir", "", "operator and account keys plus the cluster secret (default DATA/auth; copy it to every storage node)")
	return c
}

// storageNode is what `control server` runs on: its store connection and,
// on a storage node, the embedded server.
type storageNode struct {
	ns    *server.Server
	nc    *nats.Conn
	store *store.Store
	stops []func()
}

func (n *storageNode) close() {
	for i := len(n.stops) - 1; i >= 0; i-- {
		n.stops[i]()
	}
	n.stops = nil
}

func (c *clusterFlags) authOn(listen string) (bool, error) {
	switch c.authMode {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	case "auto", "":
		for _, a := range []string{listen, c.clusterListen} {
			if a == "" {
				continue
			}
			if h, _, err := splitHostPortLoose(a); err == nil && !storagenode.IsLoopback(h) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, usagef("--auth %q: want on, off or auto", c.authMode)
}

func splitHostPortLoose(a string) (string, string, error) {
	i := strings.LastIndex(a, ":")
	if i < 0 {
		return "", "", fmt.Errorf("%q: want host:port", a)
	}
	return strings.Trim(a[:i], "[]"), a[i+1:], nil
}

// start brings up this box's side of the store: an embedded storage node
// (alone or clustered), or a client of external/other storage nodes.
func (c *clusterFlags) start(ctx context.Context, stdout io.Writer, logger *zap.Logger, data, listen, external, creds string, natsLogger *zap.Logger, names store.Names) (_ *storageNode, err error) {
	n := &storageNode{}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	url := external
	layout := store.Layout{Replicas: c.replicas}
	var auth *storagenode.Auth // the embedded server's keys, when it requires credentials
	if !c.storage && external == "" {
		return nil, usagef("--storage=false holds no replicated state: give --nats URL of the storage nodes")
	}
	if c.storage && external == "" {
		on, err := c.authOn(listen)
		if err != nil {
			return nil, err
		}
		release, err := storagenode.LockDataDir(data)
		if err != nil {
			return nil, err
		}
		n.stops = append(n.stops, release)
		if c.clusterListen != "" {
			if err := storagenode.CheckClusterable(data); err != nil {
				return nil, err
			}
		}
		cfg := storagenode.Config{DataDir: data, Listen: listen, Logger: natsLogger, ServerName: c.name}
		if on {
			dir := c.authDir
			if dir == "" {
				dir = filepath.Join(data, "auth")
			}
			a, err := storagenode.LoadAuth(dir, true)
			if err != nil {
				return nil, err
			}
			cfg.Auth, auth = a, a
			b, err := a.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleControl, Names: names, Name: "control-server"})
			if err != nil {
				return nil, err
			}
			// Fresh each start, in this node's own data dir (the auth dir may
			// be shared), written whole before anyone reads it.
			creds = filepath.Join(data, "control.creds")
			if err := os.MkdirAll(data, 0o700); err != nil {
				return nil, fmt.Errorf("data dir: %w", err)
			}
			if err := os.WriteFile(creds+".tmp", b, 0o600); err != nil {
				return nil, fmt.Errorf("writing control credentials: %w", err)
			}
			if err := os.Rename(creds+".tmp", creds); err != nil {
				return nil, fmt.Errorf("writing control credentials: %w", err)
			}
			fmt.Fprintf(stdout, "credentials required on every connection; this node's control credentials: %s\n", creds)
		}
		if c.clusterListen != "" {
			if cfg.ServerName == "" {
				cfg.ServerName = store.HostName("edgeplane")
			}
			cc := &storagenode.ClusterConfig{Name: c.clusterName, Listen: c.clusterListen}
			for _, r := range strings.Split(c.routes, ",") {
				if r = strings.TrimSpace(r); r != "" {
					cc.Routes = append(cc.Routes, r)
				}
			}
			if cfg.Auth != nil {
				cc.Secret = cfg.Auth.ClusterSecret
			}
			cfg.Cluster = cc
			if layout.Replicas == 0 {
				layout.Replicas = 3
			}
		}
		ns, err := storagenode.Start(cfg)
		if err != nil {
			return nil, err
		}
		n.ns = ns
		n.stops = append(n.stops, func() { ns.Shutdown(); ns.WaitForShutdown() })
		url = ns.ClientURL()
		fmt.Fprintf(stdout, "embedded NATS with JetStream on %s (store %s)\n", url, filepath.Join(data, "jetstream"))
		if cfg.Cluster != nil {
			fmt.Fprintf(stdout, "storage node %s of cluster %s: routes on %s, seeds %s\n", ns.Name(), c.clusterName,
				c.clusterListen, strings.Join(cfg.Cluster.Routes, ","))
		}
	}
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: creds, Name: "control server", ReconnectForever: true})
	if err != nil {
		return nil, err
	}
	n.nc = nc
	n.stops = append(n.stops, nc.Close)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := store.WaitForJetStream(wctx, nc); err != nil {
		return nil, err
	}
	if !c.storage {
		// A client box binds to what the storage nodes provisioned.
		var s *store.Store
		err = retry(wctx, func() error { s, err = store.Open(wctx, nc, names); return err })
		if err != nil {
			return nil, err
		}
		n.store = s
		fmt.Fprintf(stdout, "not a storage node: client of %s, hosting no replicated state\n", url)
	} else {
		// In a cluster, stream placement needs enough storage nodes to have
		// joined; provisioning is idempotent, so every node does it and
		// retries until then.
		var s *store.Store
		last := time.Now()
		err = retry(wctx, func() error {
			pctx, cancel := context.WithTimeout(wctx, 10*time.Second)
			defer cancel()
			if n.ns != nil && c.clusterListen != "" && !n.ns.JetStreamIsLeader() {
				// Concurrent creates of one stream from several nodes
				// can go unanswered; the meta leader provisions, the
				// others bind once it is done (and take over if it
				// dies first: leadership moves).
				s, err = store.Open(pctx, nc, names)
			} else {
				s, err = store.Provision(pctx, nc, names, layout)
			}
			if err != nil && time.Since(last) > 5*time.Second {
				last = time.Now()
				fmt.Fprintf(stdout, "waiting for enough storage nodes to place %d replicas: %v\n", layout.Replicas, err)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		n.store = s
		r := layout.Replicas
		if r == 0 {
			r = 1
		}
		fmt.Fprintf(stdout, "provisioned streams and buckets for installation %s, authority %s (replicas %d)\n", names.Installation, names.Authority, r)
	}
	if n.ns != nil {
		stop, err := storagenode.ServeStatus(ctx, nc, names, n.ns)
		if err != nil {
			return nil, err
		}
		n.stops = append(n.stops, stop)
	}
	if n.ns != nil && auth != nil {
		// Revoked credentials are refused here from the bucket's history
		// on, and their connections closed as revocations arrive.
		stop, err := storagenode.WatchRevocations(ctx, n.store, n.ns, auth, func(err error) {
			logger.Warn("applying revocations", zap.Error(err))
		})
		if err != nil {
			return nil, err
		}
		n.stops = append(n.stops, stop)
	}
	return n, nil
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

// storageView is `control storage ls`'s answer.
type storageView struct {
	Quorum    *store.Error              `json:"quorum_error,omitempty"`
	Nodes     []storageNodeView         `json:"nodes"`
	Placement []store.StreamPlacement   `json:"placement,omitempty"`
	Answers   []store.StorageNodeStatus `json:"answers,omitempty"`
}

type storageNodeView struct {
	Name       string `json:"name"`
	Answered   bool   `json:"answered"`
	MetaLeader bool   `json:"meta_leader"`
	Replicas   int    `json:"replicas"`
	Leads      int    `json:"leads"`
	Lagging    int    `json:"lagging"`
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
func (f *storageFlags) withView(c *call, change bool, fn func(*store.Store, *storageView) error) error {
	return c.withStore(func(s *store.Store) error {
		view, err := readStorage(c.ctx, s, f.wait)
		if err != nil {
			return err
		}
		if change && view.Quorum != nil {
			return view.Quorum
		}
		return fn(s, view)
	})
}

func setupStorageList(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, false)
	return func(c *call) error {
		return f.withView(c, false, func(_ *store.Store, view *storageView) error {
			return c.out.emit(view, func(w io.Writer) { printStorage(w, view) })
		})
	}
}

func setupStorageAdd(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, true)
	maxR := fs.Int("max-replicas", 5, "the replica count never grows beyond this")
	return func(c *call) error {
		return f.withView(c, true, func(s *store.Store, view *storageView) error {
			return storageAdd(c.ctx, s, view, c.args[0], *maxR, f.catchup, c.out)
		})
	}
}

func setupStorageRemove(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, true)
	return func(c *call) error {
		return f.withView(c, true, func(s *store.Store, view *storageView) error {
			return storageRemove(c.ctx, s, view, c.args[0], f.catchup, c.out)
		})
	}
}

func setupStorageForget(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, false)
	authDir := fs.String("auth-dir", "", "this storage node's auth dir (system-account keys; default DATA/auth)")
	data := fs.String("data", "", "this storage node's data dir, for its auth dir")
	return func(c *call) error {
		dir := *authDir
		if dir == "" {
			if *data == "" {
				return usagef("--data DIR or --auth-dir DIR is required: taking a server out of the meta group needs the system account's keys (run this on a storage node)")
			}
			dir = filepath.Join(*data, "auth")
		}
		return f.withView(c, true, func(s *store.Store, view *storageView) error {
			return storageForget(c.ctx, s, c.client.NATSURL, dir, view, c.args[0], f.wait, c.out)
		})
	}
}

func setupStorageImport(fs *flag.FlagSet) func(*call) error {
	from := fs.String("from", "", "the stopped single box's data dir (its --data) to copy into the cluster (required)")
	fromAuth := fs.String("from-auth-dir", "", "the single box's auth dir (default FROM/auth)")
	data := fs.String("data", "", "a storage node's data dir, for the cluster's trust root in DATA/auth (required unless --auth-dir)")
	authDir := fs.String("auth-dir", "", "the cluster's auth dir, holding its trust root (overrides --data)")
	return func(c *call) error {
		if *from == "" {
			return usagef("--from DIR (the single box's data dir) is required")
		}
		root, err := signers.RootFrom(*authDir, *data)
		if err != nil {
			return err
		}
		// A writer's open has checked write quorum; the import needs
		// nothing else of the cluster's state.
		return c.withStore(func(s *store.Store) error { return storageImport(c.ctx, s, root, *from, *fromAuth, c.out) })
	}
}

// replicas is the largest replica count of any stream (at least 1).
func (v *storageView) replicas() int {
	have := 1
	for _, p := range v.Placement {
		have = max(have, p.Replicas)
	}
	return have
}

func readStorage(ctx context.Context, s *store.Store, wait time.Duration) (*storageView, error) {
	v := &storageView{}
	answers, err := store.GatherStorageStatus(ctx, s.NC, s.Names, wait)
	if err != nil {
		return nil, err
	}
	v.Answers = answers
	if qerr := s.RequireQuorum(ctx); qerr != nil {
		if !store.HasCode(qerr, store.CodeQuorumUnavailable) {
			return nil, qerr
		}
		v.Quorum = store.AsError(qerr)
	} else {
		if v.Placement, err = s.Placement(ctx); err != nil {
			return nil, err
		}
	}
	byName := map[string]*storageNodeView{}
	node := func(name string) *storageNodeView {
		if byName[name] == nil {
			byName[name] = &storageNodeView{Name: name}
		}
		return byName[name]
	}
	for _, a := range answers {
		node(a.Server).Answered = true
		for _, p := range a.Peers {
			node(p.Name)
		}
		if a.MetaLeader != "" {
			node(a.MetaLeader).MetaLeader = true
		}
	}
	for _, p := range v.Placement {
		for _, peer := range p.Peers {
			node(peer).Replicas++
		}
		if p.Leader != "" {
			node(p.Leader).Leads++
		}
		for _, l := range p.Lagging {
			node(l).Lagging++
		}
	}
	for _, nv := range byName {
		v.Nodes = append(v.Nodes, *nv)
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	return v, nil
}

func printStorage(w io.Writer, v *storageView) {
	if v.Quorum != nil {
		fmt.Fprintf(w, "QUORUM LOST: %s\n\n", v.Quorum.Message)
	} else {
		fmt.Fprintln(w, "write quorum: ok")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tANSWERED\tMETA LEADER\tREPLICAS\tLEADS\tLAGGING")
	for _, n := range v.Nodes {
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%d\t%d\n", n.Name, yesNo(n.Answered), yesNo(n.MetaLeader), n.Replicas, n.Leads, n.Lagging)
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// storageAdd makes id hold replicas: the node must answer, be a current
// member of the JetStream meta group, and quorum must hold; then the
// replica count grows to the largest odd number of such nodes (at most
// maxR), and the command waits until every new replica has caught up.
func storageAdd(ctx context.Context, s *store.Store, v *storageView, id string, maxR int, catchup time.Duration, out *output) error {
	var seen, leaderView *store.StorageNodeStatus
	for i := range v.Answers {
		if v.Answers[i].Server == id {
			seen = &v.Answers[i]
		}
	}
	if seen == nil {
		return store.Errorf(store.CodeUnavailable, "storage node %s did not answer: start it with `control server --cluster-listen ... --routes ...` and the same auth dir first", id).With("node", id)
	}
	for i := range v.Answers {
		if v.Answers[i].Server == v.Answers[i].MetaLeader {
			leaderView = &v.Answers[i]
		}
	}
	current := map[string]bool{}
	if leaderView != nil {
		for _, p := range leaderView.Peers {
			if p.Current && !p.Offline {
				current[p.Name] = true
			}
		}
	}
	if !current[id] {
		return store.Errorf(store.CodeConflict, "storage node %s is not a current member of the JetStream cluster yet (still catching up, or routes missing); try again when `control storage ls` shows it", id).With("node", id)
	}
	target := len(current)
	if target > maxR {
		target = maxR
	}
	if target%2 == 0 {
		target--
	}
	have := v.replicas()
	if target <= have {
		return out.emit(map[string]any{"node": id, "replicas": have, "changed": false}, func(w io.Writer) {
			fmt.Fprintf(w, "storage node %s is a current cluster member; replicas stay at %d (an odd count of at most %d), so it holds no replicas yet: add another node to grow to %d\n",
				id, have, maxR, have+2)
		})
	}
	fmt.Fprintf(out.w, "growing every stream and bucket from %d to %d replicas\n", have, target)
	deadline := time.Now().Add(catchup)
	if err := s.SetReplicas(ctx, target, catchup); err != nil {
		return err
	}
	pl, err := waitCaughtUp(ctx, s, target, time.Until(deadline))
	if err != nil {
		return err
	}
	return out.emit(map[string]any{"node": id, "replicas": target, "changed": true, "placement": pl}, func(w io.Writer) {
		fmt.Fprintf(w, "storage node %s added: %d streams and buckets at %d replicas, all caught up\n", id, len(pl), target)
	})
}

// storageRemove takes id's replicas away. It refuses when the remaining
// nodes could not keep write quorum: of the streams (an odd replica count
// on the nodes that answer) and of the JetStream meta group, which keeps id
// as a member (it only stops holding replicas) and so needs a majority of
// its members other than id to stay up.
func storageRemove(ctx context.Context, s *store.Store, v *storageView, id string, catchup time.Duration, out *output) error {
	var live []string
	found := false
	for _, n := range v.Nodes {
		if n.Name == id {
			found = true
			continue
		}
		if n.Answered {
			live = append(live, n.Name)
		}
	}
	if !found {
		return store.Errorf(store.CodeNotFound, "no storage node %s", id).With("node", id)
	}
	have := v.replicas()
	target := have
	if len(live) < target {
		target = len(live)
		if target%2 == 0 {
			target--
		}
	}
	members := len(v.Nodes)
	for _, a := range v.Answers {
		members = max(members, a.ClusterSize)
	}
	if target < 1 || len(live) < target/2+1 || len(live) < members/2+1 {
		return store.Errorf(store.CodeQuorumUnavailable, "removing %s would leave %d answering storage nodes (%s) of the %d in the JetStream cluster, "+
			"too few for write quorum (%d needed): bring the missing storage nodes back first", id, len(live), strings.Join(live, ", "), members, members/2+1).
			With("node", id).With("remaining", strings.Join(live, ",")).With("needed", fmt.Sprint(members/2+1))
	}
	deadline := time.Now().Add(catchup)
	if target < have {
		// A shrinking stream keeps its leader: move leadership off id first,
		// so that the replicas that stay are on the remaining nodes.
		led, err := s.StepDownFrom(ctx, id)
		if err != nil {
			return err
		}
		if len(led) > 0 {
			fmt.Fprintf(out.w, "moving the leader of %d streams and buckets off %s\n", len(led), id)
			if _, err := waitPlacement(ctx, s, time.Until(deadline), "leaders to move off "+id, func(p store.StreamPlacement) bool {
				return p.Leader != "" && p.Leader != id
			}); err != nil {
				return err
			}
		}
		fmt.Fprintf(out.w, "shrinking every stream and bucket from %d to %d replicas (%d storage nodes remain)\n", have, target, len(live))
		if err := s.SetReplicas(ctx, target, time.Until(deadline)); err != nil {
			return err
		}
		if _, err := waitCaughtUp(ctx, s, target, time.Until(deadline)); err != nil {
			return err
		}
	}
	// Replicas still on id move to a free node, caught up before id's copy
	// is dropped.
	moved, err := s.EvacuatePeer(ctx, id)
	if err != nil {
		return err
	}
	if len(moved) > 0 {
		fmt.Fprintf(out.w, "moving %d streams and buckets off %s to the other storage nodes\n", len(moved), id)
	}
	pl, err := waitPlacement(ctx, s, time.Until(deadline), fmt.Sprintf("%d caught-up replicas without %s", target, id), func(p store.StreamPlacement) bool {
		return caughtUp(p, target) && !slices.Contains(p.Peers, id)
	})
	if err != nil {
		return err
	}
	return out.emit(map[string]any{"node": id, "replicas": target, "placement": pl}, func(w io.Writer) {
		fmt.Fprintf(w, "storage node %s removed from every stream and bucket (replicas %d); stop its `control server` now, "+
			"then `control storage forget %s` takes it out of the JetStream meta group (or start it again and `storage add` it). "+
			"It keeps a copy of the store in its data dir: treat that like a backup (it holds private keys).\n", id, target, id)
	})
}

// caughtUp reports whether p has replicas replicas, a leader and none
// lagging.
func caughtUp(p store.StreamPlacement, replicas int) bool {
	return len(p.Peers) == replicas && len(p.Lagging) == 0 && p.Leader != ""
}

func waitCaughtUp(ctx context.Context, s *store.Store, replicas int, timeout time.Duration) ([]store.StreamPlacement, error) {
	return waitPlacement(ctx, s, timeout, fmt.Sprintf("%d caught-up replicas", replicas), func(p store.StreamPlacement) bool {
		return caughtUp(p, replicas)
	})
}

// waitPlacement waits until every stream's placement satisfies ok.
func waitPlacement(ctx context.Context, s *store.Store, timeout time.Duration, what string, ok func(store.StreamPlacement) bool) ([]store.StreamPlacement, error) {
	deadline := time.Now().Add(timeout)
	for {
		pl, err := s.Placement(ctx)
		var waiting []string
		if err == nil {
			for _, p := range pl {
				if !ok(p) {
					waiting = append(waiting, p.Stream)
				}
			}
			if len(waiting) == 0 {
				return pl, nil
			}
			err = fmt.Errorf("still waiting for %s", strings.Join(waiting, ", "))
		}
		if time.Now().After(deadline) {
			return pl, store.Errorf(store.CodeUnavailable, "waiting for %s: not settled within %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return pl, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
