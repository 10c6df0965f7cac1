package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// WaitForJetStream waits until the JetStream API answers on nc: in a
// cluster, until a meta leader is elected, without which nothing can be
// created. It returns a structured error naming the last failure if ctx
// ends first.
func WaitForJetStream(ctx context.Context, nc *nats.Conn) error {
	js, err := newJetStream(nc)
	if err != nil {
		return err
	}
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return &Error{Code: CodeQuorumUnavailable, Message: "JetStream has no meta leader (are enough storage nodes up and routed to each other?): " + last.Error()}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// StorageStatusSubject is where every storage node's `control server`
// answers with what its own server sees of the JetStream cluster. There is
// no queue group: every reachable node answers.
func (n Names) StorageStatusSubject() string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".storage.status"
}

// StoragePeer is one JetStream meta-group member as a node sees it.
type StoragePeer struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline"`
	// Active is how long ago this node last heard from the peer.
	Active Duration `json:"active"`
	Lag    uint64   `json:"lag,omitempty"`
}

// StreamReplica is one stream's local replica state on a node.
type StreamReplica struct {
	Name     string `json:"name"`
	Leader   string `json:"leader,omitempty"`
	Msgs     uint64 `json:"msgs"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Lost counts the messages (LostBytes their bytes) the node's server
	// found it could not read back from its copy since it started.
	Lost      uint64 `json:"lost,omitempty"`
	LostBytes uint64 `json:"lost_bytes,omitempty"`
	// Rebuilt is when the node found its copy damaged as it started and
	// set it aside to be rebuilt from its peers; Damage is what it found.
	// Unset when it never did (or an operator cleared the record).
	Rebuilt *time.Time `json:"rebuilt,omitempty"`
	Damage  string     `json:"damage,omitempty"`
}

// StorageNodeStatus is a storage node's own live view: an observation,
// answered on request and never stored.
type StorageNodeStatus struct {
	Version      int             `json:"version"`
	Server       string          `json:"server"`
	Cluster      string          `json:"cluster,omitempty"`
	MetaLeader   string          `json:"meta_leader,omitempty"`
	ClusterSize  int             `json:"cluster_size"`
	QuorumNeeded int             `json:"quorum_needed"`
	Peers        []StoragePeer   `json:"peers,omitempty"`
	Streams      []StreamReplica `json:"streams,omitempty"`
	// EncryptedAtRest is set when the node's store is encrypted with a
	// store key: a backup of it must be sealed too.
	EncryptedAtRest bool `json:"encrypted_at_rest,omitempty"`
	// Release is the release of the `control server` answering, and
	// Upgrade the latest upgrade of it (`control storage upgrade`), if
	// any: how a storage upgrade sees the node back on its new release.
	Release string         `json:"release,omitempty"`
	Upgrade *UpgradeStatus `json:"upgrade,omitempty"`
	At      time.Time      `json:"at"`
}

func (r *StorageNodeStatus) version() int { return r.Version }

// ServeStorageStatus answers StorageStatusSubject with what status reports
// until ctx ends or the returned stop is called. A storage node serves its
// own view (package storagenode); status returns ok false when this
// connection must stay silent, say after its server stopped and the client
// moved to another node.
func ServeStorageStatus(ctx context.Context, nc *nats.Conn, names Names, status func() (st *StorageNodeStatus, ok bool, err error)) (func(), error) {
	sub, err := nc.Subscribe(names.StorageStatusSubject(), func(m *nats.Msg) {
		if !ReplyOK(m.Reply) {
			return
		}
		st, ok, err := status()
		if !ok {
			return
		}
		var rep rpcReply
		if err != nil {
			rep.Error = AsError(err)
		} else {
			rep.Result, _ = json.Marshal(st)
		}
		out, _ := json.Marshal(rep)
		_ = m.Respond(out)
	})
	if err != nil {
		return nil, fmt.Errorf("serving storage status: %w", err)
	}
	// As in Serve: make the interest known before callers can ask.
	flushCtx, flushCancel := context.WithTimeout(ctx, 5*time.Second)
	_ = nc.FlushWithContext(flushCtx)
	flushCancel()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
	}()
	return cancel, nil
}

// GatherStorageStatus asks every reachable storage node for its view and
// collects the answers that arrive within wait (or until every node the
// answers name has answered). Nodes that cannot be reached simply do not
// answer; an empty result is not an error.
func GatherStorageStatus(ctx context.Context, nc *nats.Conn, names Names, wait time.Duration) ([]StorageNodeStatus, error) {
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, classify(fmt.Errorf("asking storage nodes: %w", err))
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(names.StorageStatusSubject(), inbox, nil); err != nil {
		return nil, classify(fmt.Errorf("asking storage nodes: %w", err))
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var out []StorageNodeStatus
	known := map[string]bool{}
	answered := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case <-timer.C:
			return out, nil
		case m := <-ch:
			var rep rpcReply
			var st StorageNodeStatus
			if json.Unmarshal(m.Data, &rep) != nil || rep.Error != nil || Decode("storage status", rep.Result, &st) != nil {
				continue
			}
			out = append(out, st)
			answered[st.Server] = true
			for _, p := range st.Peers {
				known[p.Name] = true
			}
			done := true
			for k := range known {
				if !answered[k] {
					done = false
				}
			}
			if done {
				return out, nil
			}
		}
	}
}

// QuorumCheckTimeout bounds how long RequireQuorum waits for a stream
// leader before it concludes that there is none.
const QuorumCheckTimeout = 2 * time.Second

// PeerActiveBound is how long a replica may go unheard before it no longer
// counts towards quorum. RAFT heartbeats every second.
const PeerActiveBound = 3 * time.Second

// RequireQuorum fails with a structured quorum_unavailable error, naming
// the missing storage nodes, when the store cannot commit writes now. Every
// mutating operation calls it before its first write, so that a lost quorum
// refuses the operation before anything changes; nothing is queued and
// nothing fails over. While a quorum of storage nodes is up but the commits
// stream has no leader (one is being elected), it waits for the election,
// for up to the store's election wait. On a single server it costs one API
// round trip.
func (s *Store) RequireQuorum(ctx context.Context) error {
	return checkQuorum(ctx, s.NC, s.Names, s.logger(), s.electionWait)
}

// CheckQuorum is RequireQuorum on a bare connection, for a client that has
// not bound the store yet (binding needs every stream leader to answer).
func CheckQuorum(ctx context.Context, nc *nats.Conn, names Names) error {
	return checkQuorum(ctx, nc, names, zap.NewNop(), ElectionWait)
}

func checkQuorum(ctx context.Context, nc *nats.Conn, names Names, log *zap.Logger, wait time.Duration) error {
	js, err := newJetStream(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, QuorumCheckTimeout)
		// Stream info is answered by the stream's RAFT leader, whose view
		// of its replicas is the authoritative one.
		str, err := js.Stream(cctx, names.DeployCommitsStream())
		cancel()
		var qerr *Error
		if err == nil {
			info := str.CachedInfo()
			if qerr = quorumOf(info.Config.Name, info.Cluster); qerr == nil {
				return nil
			}
		} else {
			if ctx.Err() != nil {
				return classify(err)
			}
			if !quorumSymptom(err) {
				return classify(fmt.Errorf("checking write quorum: %w", err))
			}
		}
		// No leader answered, or the one that did has not heard from a
		// quorum of replicas: ask the storage nodes we can reach what they
		// see. While they are a quorum, a leader is being elected, or has
		// just been and has yet to hear from its followers: wait for it.
		nodes, _ := GatherStorageStatus(ctx, nc, names, 500*time.Millisecond)
		cause := err
		if qerr != nil {
			cause = qerr
		}
		lost, majority := quorumLost(nodes, cause)
		if qerr == nil {
			qerr = lost
		}
		if !majority || time.Now().After(deadline) {
			return qerr
		}
		log.Debug("storage nodes are a quorum, waiting for the commits stream's leader",
			zap.Int("attempt", attempt), zap.String("reachable", lost.Detail["reachable"]), zap.String("seen", qerr.Message))
		select {
		case <-ctx.Done():
			return qerr
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// quorumSymptom reports whether err looks like a JetStream that cannot reach
// its leaders (rather than, say, a missing stream).
func quorumSymptom(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return leaderUnreachable(err)
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// quorumOf judges a stream's cluster info as its leader reported it.
func quorumOf(stream string, ci *jetstream.ClusterInfo) *Error {
	if ci == nil || len(ci.Replicas) == 0 {
		// A single replica: its server answered, so it can write.
		return nil
	}
	size := 1 + len(ci.Replicas)
	need := size/2 + 1
	live := []string{}
	if ci.Leader != "" {
		live = append(live, ci.Leader)
	}
	var missing []string
	for _, r := range ci.Replicas {
		if r.Current && !r.Offline && r.Active <= PeerActiveBound {
			live = append(live, r.Name)
		} else {
			missing = append(missing, r.Name)
		}
	}
	if ci.Leader != "" && len(live) >= need {
		return nil
	}
	sort.Strings(live)
	sort.Strings(missing)
	return quorumError(live, missing, need, size, "stream "+stream)
}

// quorumLost builds the error when no leader answered, from the views of
// the nodes that did, and says whether those nodes are a majority (a
// leader is being elected) or not (none can be).
func quorumLost(nodes []StorageNodeStatus, cause error) (*Error, bool) {
	known := map[string]bool{}
	reach := map[string]bool{}
	size := 0
	for _, n := range nodes {
		reach[n.Server] = true
		known[n.Server] = true
		for _, p := range n.Peers {
			known[p.Name] = true
		}
		if n.ClusterSize > size {
			size = n.ClusterSize
		}
	}
	var live, missing []string
	for k := range known {
		if reach[k] {
			live = append(live, k)
		} else {
			missing = append(missing, k)
		}
	}
	sort.Strings(live)
	sort.Strings(missing)
	if size < len(known) {
		size = len(known)
	}
	if size == 0 {
		e := quorumError(nil, nil, 0, 0, "no storage node answered")
		e.Detail["cause"] = cause.Error()
		return e, false
	}
	e := quorumError(live, missing, size/2+1, size, "no leader answered within "+QuorumCheckTimeout.String())
	e.Detail["cause"] = cause.Error()
	return e, len(live) >= size/2+1
}

func quorumError(live, missing []string, need, size int, seen string) *Error {
	msg := fmt.Sprintf("write quorum unavailable: %d of %d storage nodes reachable, %d needed", len(live), size, need)
	if size == 0 {
		msg = "write quorum unavailable: no storage node reachable"
	}
	if len(missing) > 0 {
		msg += "; missing: " + strings.Join(missing, ", ")
	}
	msg += ". Writes are refused (nothing queued, no failover) until the missing storage nodes return."
	e := &Error{Code: CodeQuorumUnavailable, Message: msg, Detail: map[string]string{
		"missing": strings.Join(missing, ","), "reachable": strings.Join(live, ","),
		"needed": strconv.Itoa(need), "seen_by": seen,
	}}
	return e
}

// StreamNames lists every stream of the store (buckets as their KV_
// streams), for operations that act on all of them.
func (s *Store) StreamNames() []string {
	streams, buckets := s.layout()
	out := make([]string, 0, len(streams)+len(buckets))
	for _, st := range streams {
		out = append(out, st.cfg.Name)
	}
	for _, b := range buckets {
		out = append(out, "KV_"+b.cfg.Bucket)
	}
	return out
}

// StreamPlacement is where one stream's replicas live.
type StreamPlacement struct {
	Stream   string   `json:"stream"`
	Replicas int      `json:"replicas"`
	Leader   string   `json:"leader"`
	Peers    []string `json:"peers"`
	Lagging  []string `json:"lagging,omitempty"`
}

// StreamInfo reads the info of the stream named name (a bucket's is
// "KV_<bucket>"): its counts, configuration and cluster, for tools that
// look at the storage itself (import, load tests). An unknown stream is
// jetstream.ErrStreamNotFound.
func (s *Store) StreamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	str, err := s.JS.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return str.CachedInfo(), nil
}

// Placement reads the replica placement of every stream of the store.
func (s *Store) Placement(ctx context.Context) ([]StreamPlacement, error) {
	var out []StreamPlacement
	for _, name := range s.StreamNames() {
		str, err := s.JS.Stream(ctx, name)
		if err != nil {
			return nil, classify(fmt.Errorf("reading stream %s: %w", name, err))
		}
		info := str.CachedInfo()
		p := StreamPlacement{Stream: name, Replicas: info.Config.Replicas}
		if ci := info.Cluster; ci != nil {
			p.Leader = ci.Leader
			if ci.Leader != "" {
				p.Peers = append(p.Peers, ci.Leader)
			}
			for _, r := range ci.Replicas {
				p.Peers = append(p.Peers, r.Name)
				if !r.Current || r.Offline {
					p.Lagging = append(p.Lagging, r.Name)
				}
			}
		}
		sort.Strings(p.Peers)
		out = append(out, p)
	}
	return out, nil
}

// SetReplicas changes the replica count of every stream and bucket. JetStream
// places new replicas and catches them up; shrinking drops replicas.
//
// A storage node can be a current member of the meta group while the meta
// leader still refuses to place replicas on it: the leader places only on
// servers whose statistics report (STATSZ) it holds, and it forgets that
// report whenever the node's routes to it reconnect, as they do while a node
// joins. Such a refusal (see placementPending) is asked again until wait has
// passed, then SetReplicas fails with a structured unavailable error
// carrying JetStream's reason.
func (s *Store) SetReplicas(ctx context.Context, replicas int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for _, name := range s.StreamNames() {
		for {
			str, err := s.JS.Stream(ctx, name)
			if err != nil {
				return classify(fmt.Errorf("reading stream %s: %w", name, err))
			}
			cfg := str.CachedInfo().Config
			if cfg.Replicas == replicas {
				break
			}
			cfg.Replicas = replicas
			_, err = s.JS.UpdateStream(ctx, cfg)
			if err == nil {
				break
			}
			if !placementPending(err) {
				return classify(fmt.Errorf("setting %s to %d replicas: %w", name, replicas, err))
			}
			if time.Now().After(deadline) {
				return Errorf(CodeUnavailable, "setting %s to %d replicas: the meta leader still cannot place them after %s: %w "+
					"(a storage node it has not heard a statistics report from counts as offline; see `control storage ls`)",
					name, replicas, wait, err).With("stream", name).With("replicas", strconv.Itoa(replicas))
			}
			select {
			case <-ctx.Done():
				return classify(fmt.Errorf("setting %s to %d replicas: %w (last refusal: %v)", name, replicas, ctx.Err(), err))
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// placementPending reports whether err is the meta leader refusing to place
// replicas because a peer counts as offline for placement (JetStream error
// 10005 "no suitable peers for placement, peer offline"): a node it has no
// statistics report from yet. Other placement refusals (storage, tags) are
// not waited out.
func placementPending(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10005 && strings.Contains(apiErr.Description, "peer offline")
}

// HasReplicaOn lists the streams of the store with a replica on serverName.
func (s *Store) HasReplicaOn(ctx context.Context, serverName string) ([]string, error) {
	var out []string
	for _, name := range s.StreamNames() {
		str, err := s.JS.Stream(ctx, name)
		if err != nil {
			return out, classify(fmt.Errorf("reading stream %s: %w", name, err))
		}
		ci := str.CachedInfo().Cluster
		has := ci != nil && ci.Leader == serverName
		if ci != nil {
			for _, r := range ci.Replicas {
				has = has || r.Name == serverName
			}
		}
		if has {
			out = append(out, name)
		}
	}
	return out, nil
}

// StepDownFrom asks every stream led by serverName to elect another leader
// among its other replicas. A shrinking stream keeps its leader, so this
// comes before a shrink that must not keep serverName.
func (s *Store) StepDownFrom(ctx context.Context, serverName string) ([]string, error) {
	var touched []string
	for _, name := range s.StreamNames() {
		str, err := s.JS.Stream(ctx, name)
		if err != nil {
			return touched, classify(fmt.Errorf("reading stream %s: %w", name, err))
		}
		ci := str.CachedInfo().Cluster
		if ci == nil || ci.Leader != serverName || len(ci.Replicas) == 0 {
			continue
		}
		if err := s.streamAPI(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+name, nil, "moving the leader of stream "+name+" off "+serverName); err != nil {
			return touched, err
		}
		touched = append(touched, name)
	}
	return touched, nil
}

// EvacuatePeer moves serverName's replicas off every stream that has one
// there: JetStream places each on another storage node, catches it up and
// only then drops serverName's, so no acknowledged write depends on it
// alone. It fails (conflict) for a stream with no free storage node to move
// to; the caller shrinks the replica count first.
func (s *Store) EvacuatePeer(ctx context.Context, serverName string) ([]string, error) {
	streams, err := s.HasReplicaOn(ctx, serverName)
	if err != nil {
		return nil, err
	}
	var touched []string
	for _, name := range streams {
		req, _ := json.Marshal(map[string]string{"peer": serverName})
		if err := s.streamAPI(ctx, "$JS.API.STREAM.PEER.EVACUATE."+name, req, "moving stream "+name+" off "+serverName); err != nil {
			return touched, err
		}
		touched = append(touched, name)
	}
	return touched, nil
}

// streamAPI sends one JetStream API request and turns its error answer into
// a structured conflict.
func (s *Store) streamAPI(ctx context.Context, subject string, req []byte, what string) error {
	msg, err := s.NC.RequestWithContext(ctx, subject, req)
	if err != nil {
		return classify(fmt.Errorf("%s: %w", what, err))
	}
	var rep struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return fmt.Errorf("%s: undecodable answer: %w", what, err)
	}
	if rep.Error != nil {
		return Errorf(CodeConflict, "%s: %s", what, rep.Error.Description).With("api", subject)
	}
	return nil
}

// createOrUpdateStream is CreateOrUpdateStream that asks first: in a
// cluster, an update request for a stream that does not exist yet, sent
// through a server that is not the meta leader, may go unanswered until the
// request times out, so Provision would never get to the create.
//
// An existing stream keeps its replica count: the layout's count applies
// only at creation, and afterwards changes only through `control storage
// add|remove`. Otherwise a storage node restarting with the default layout
// would silently undo a removal.
//
// It keeps its persist mode too, which JetStream refuses to change, except
// for a synced stream the layout now wants unsynced: that one is recreated
// (recreateUnsynced).
func createOrUpdateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	old, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		str, err := js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another storage node created it meanwhile.
			return js.UpdateStream(ctx, cfg)
		}
		return str, err
	case err != nil:
		return nil, err
	}
	cfg.Replicas = old.CachedInfo().Config.Replicas
	if mode := old.CachedInfo().Config.PersistMode; mode != cfg.PersistMode {
		if mode == jetstream.DefaultPersistMode && cfg.PersistMode == jetstream.AsyncPersistMode && cfg.Replicas == 1 {
			return recreateUnsynced(ctx, js, old, cfg)
		}
		cfg.PersistMode = mode
	}
	return js.UpdateStream(ctx, cfg)
}
