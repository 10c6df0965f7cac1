package projection_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const wait = 10 * time.Second

// connectTo returns a Connect function that dials url as a long-running
// gateway does (reconnecting forever) and binds to the provisioned store.
func connectTo(t testing.TB, url string) func(context.Context) (*store.Store, error) {
	return func(ctx context.Context) (*store.Store, error) {
		nc, err := store.Connect(store.ConnectOptions{URL: url, Name: "gateway-" + t.Name(), ReconnectForever: true, Timeout: time.Second})
		if err != nil {
			return nil, err
		}
		names, _ := store.NewNames("", "")
		st, err := store.Open(ctx, nc, names)
		if err != nil {
			nc.Close()
			return nil, err
		}
		t.Cleanup(nc.Close)
		return st, nil
	}
}

type running struct {
	*projection.Projection
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs a projection until the test ends (or stop is called).
func start(t testing.TB, cfg projection.Config, opts ...func(*projection.Projection)) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
		if os.Getenv("PROJECTION_TEST_LOG") != "" {
			cfg.Logger, _ = zap.NewDevelopment()
		}
	}
	if cfg.ReportInterval == 0 {
		cfg.ReportInterval = 100 * time.Millisecond
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = 10 * time.Millisecond
	}
	p, err := projection.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Projection: p, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = p.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.cancel()
	<-r.done
}

func waitSeq(t testing.TB, p *projection.Projection, seq uint64) {
	t.Helper()
	storetest.Eventually(t, wait, "projection to apply the routing events", func() bool { return p.View().Seq >= seq })
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func web(addr string, port int, ids ...string) storetest.Service {
	s := storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com", "*.shop.example.com"}}}}
	for _, id := range ids {
		s.Instances = append(s.Instances, storetest.Instance{ID: id, Machine: "m1", Address: addr, Port: port})
	}
	return s
}

func endpointIDs(s *projection.Service) string {
	var ids []string
	for _, e := range s.Endpoints {
		ids = append(ids, e.InstanceID)
	}
	return strings.Join(ids, ",")
}

func TestLoadThenFollowEvents(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	// State committed before the gateway starts comes from the load.
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": web("127.0.0.1", 9001, "w1", "w2"),
		"api": {Routes: []store.Route{{Hosts: []string{"shop.example.com"}, PathPrefixes: []string{"/api"}}},
			Instances: []storetest.Instance{{ID: "a1", Machine: "m1", Address: "127.0.0.1", Port: 9002}}},
	}); err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL), Name: "gw-1"})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	v := p.View()
	if v.Stale {
		t.Error("a view loaded from the store is marked stale")
	}
	if s, ok := v.Lookup("shop.example.com", "/api/x"); !ok || s.Name != "api" {
		t.Fatalf("lookup /api/x = %v", s)
	}
	if s, ok := v.Lookup("eu.shop.example.com", "/"); !ok || endpointIDs(s) != "w1,w2" {
		t.Fatalf("wildcard lookup = %v", s)
	}

	// A redeploy replaces endpoints and drops a service the manifest lost.
	changed := p.Changed()
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": web("127.0.0.1", 9003, "w3"),
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	select {
	case <-changed:
	default:
		t.Error("Changed() channel not closed after a new view")
	}
	v = p.View()
	if s, ok := v.Lookup("shop.example.com", "/api/x"); !ok || s.Name != "web" || endpointIDs(s) != "w3" || s.Revision != 2 {
		t.Fatalf("after redeploy /api/x = %+v; want web with w3 at revision 2", s)
	}
	if _, ok := v.Service("shop", "api"); ok {
		t.Error("removed service still present")
	}
	st := p.Status()
	if st.State != "serving" || !st.Connected || st.AppliedSeq != seq || st.LagSeqs != 0 || st.EventsApplied == 0 || st.Rebuilds != 0 {
		t.Errorf("status = %+v", st)
	}

	// The gateway reports the sequence it applied, as an observation.
	storetest.Eventually(t, wait, "gateway observation at the applied sequence", func() bool {
		var obs store.GatewayObservation
		_, err := store.GetJSON(ctx, storetest.Bucket(t, srv.Store, srv.Store.Names.GatewaysBucket()), store.GatewayKey("gw-1"), &obs)
		return err == nil && obs.AppliedSeq == seq && obs.Gateway == "gw-1" && !obs.Stale
	})
}

func TestDrainingAndErroredInstancesLeaveAtOnce(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": web("127.0.0.1", 9001, "w1", "w2", "w3"),
	}); err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	seq, err := storetest.SetInstance(ctx, srv.Store, "shop", "w2", store.InstanceDraining, "")
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "w1,w3" {
		t.Fatalf("after draining w2: %s", endpointIDs(s))
	}
	seq, err = storetest.SetInstance(ctx, srv.Store, "shop", "w3", store.InstanceReady, "exit status 1")
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "w1" {
		t.Fatalf("after w3 errored: %s", endpointIDs(s))
	}
}

// An event the control plane did not sign is not applied: the service
// keeps its last good state, the projection says so, and signed events
// after it apply.
func TestUnsignedEventsAreRefusedAndTheLastGoodViewStays(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": web("127.0.0.1", 9001, "w1"),
	}); err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	subj := srv.Store.Names.RoutingServiceSubject("shop", "web")
	good := lastSigned(t, ctx, srv.Store, subj)
	forged := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		Routes:    []store.Route{{Hosts: []string{"shop.example.com", "bank.example.com"}}},
		Endpoints: []store.Endpoint{{InstanceID: "evil", Machine: "m1", Address: "203.0.113.9", Port: 80}}}
	body, _ := json.Marshal(forged)
	stranger, _ := signing.NewSigner()
	info, _ := storetest.Stream(t, srv.Store, srv.Store.Names.RoutingEventsStream()).Info(ctx)
	next := info.State.LastSeq + 1
	for _, m := range []*nats.Msg{
		{Subject: subj, Data: body},
		{Subject: subj, Data: body, Header: nats.Header{signing.Header: {stranger.Sign(signing.Message{Subject: subj, Seq: next + 1, Body: body})}}},
		{Subject: subj, Data: good.Data, Header: nats.Header{signing.Header: {good.Header.Get(signing.Header)}}},
	} {
		if _, err := srv.Store.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	_, seq, err := storetest.Deploy(ctx, srv.Store, "other", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"other.test"}}}, Instances: []storetest.Instance{{ID: "o1", Machine: "m1", Address: "127.0.0.1", Port: 9009}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	st := p.Status()
	if st.Signatures.Refused != 3 {
		t.Errorf("refused = %d, want 3", st.Signatures.Refused)
	}
	if !strings.Contains(st.Signatures.LastRefusal, "refused routing event") || st.Signatures.TrustRoot == "" || st.Signatures.Signers == 0 {
		t.Errorf("signature status = %+v", st.Signatures)
	}
	if s, ok := p.View().Service("shop", "web"); !ok || endpointIDs(s) != "w1" {
		t.Errorf("shop/web changed by events nobody signed: %v", s)
	}
	if _, ok := p.View().Lookup("bank.example.com", "/"); ok {
		t.Error("a forged route is served")
	}
	if _, ok := p.View().Lookup("other.test", "/"); !ok {
		t.Error("the signed event after the refused ones was not applied")
	}

	// A gateway starting now cannot know shop/web's last good state: it
	// leaves the service out and says why, rather than serve the forgery.
	q := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "second gateway's load", func() bool { return q.Status().Loads == 1 })
	if _, ok := q.View().Service("shop", "web"); ok {
		t.Error("a fresh gateway serves a subject whose last event nobody signed")
	}
	if q.Status().Signatures.Refused != 1 {
		t.Errorf("fresh gateway refused %d, want 1", q.Status().Signatures.Refused)
	}
}

// lastSigned reads the last message on subject of the routing stream.
func lastSigned(t *testing.T, ctx context.Context, s *store.Store, subject string) *store.StoredMsg {
	t.Helper()
	var found *store.StoredMsg
	if err := s.LastOf(ctx, s.Names.RoutingEventsStream(), []string{subject}, func(m *store.StoredMsg) error { found = m; return nil }); err != nil || found == nil {
		t.Fatalf("reading %s: %v", subject, err)
	}
	return found
}

func TestBadEventIsSkippedAndReported(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": web("127.0.0.1", 9001, "w1"),
	}); err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	subj := srv.Store.Names.RoutingServiceSubject("shop", "web")
	for _, data := range []string{`{not json`, `{"version":99,"kind":"service.upsert","namespace":"shop","service":"web"}`,
		`{"version":1,"kind":"service.explode","namespace":"shop","service":"web"}`} {
		// Signed by the control plane, so that they get past the
		// signature check to the decoder.
		if _, err := srv.Store.AppendSigned(ctx, srv.Store.Names.RoutingEventsStream(), subj, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	_, seq, err := storetest.Deploy(ctx, srv.Store, "other", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"other.test"}}}, Instances: []storetest.Instance{{ID: "o1", Machine: "m1", Address: "127.0.0.1", Port: 9009}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	st := p.Status()
	if st.BadEvents != 3 {
		t.Errorf("bad events = %d, want 3", st.BadEvents)
	}
	if !strings.Contains(st.LastError, "skipping routing event") {
		t.Errorf("last error = %q, want it to name the skipped event", st.LastError)
	}
	// Nothing lost: shop/web keeps its state, later events still apply.
	if s, ok := p.View().Service("shop", "web"); !ok || endpointIDs(s) != "w1" {
		t.Errorf("shop/web changed by bad events: %v", s)
	}
	if _, ok := p.View().Lookup("other.test", "/"); !ok {
		t.Error("event after the bad ones not applied")
	}
	if st.Rebuilds != 0 {
		t.Errorf("bad events caused %d rebuilds", st.Rebuilds)
	}
}

func TestSnapshotServesStaleWhenNATSIsDown(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "gw", "routing.json")
	srv := storetest.Start(t)
	ctx := ctxT(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9001, "w1")})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL), SnapshotPath: snap})
	waitSeq(t, p.Projection, seq)
	storetest.Eventually(t, wait, "snapshot written", func() bool { _, err := os.Stat(snap); return err == nil })
	p.stop()

	// Restart while NATS is unreachable: the snapshot serves, marked stale,
	// and the projection keeps retrying.
	attempts := make(chan struct{}, 100)
	p2 := start(t, projection.Config{SnapshotPath: snap, Connect: func(context.Context) (*store.Store, error) {
		select {
		case attempts <- struct{}{}:
		default:
		}
		return nil, &store.Error{Code: store.CodeUnavailable, Message: "connecting to NATS: connection refused"}
	}})
	v := p2.View()
	if !v.Stale || v.Seq != seq {
		t.Fatalf("restarted view: stale=%v seq=%d, want stale at %d", v.Stale, v.Seq, seq)
	}
	if s, ok := v.Lookup("shop.example.com", "/"); !ok || endpointIDs(s) != "w1" {
		t.Fatalf("snapshot lookup = %v", s)
	}
	<-attempts
	<-attempts
	st := p2.Status()
	if st.State != "serving-stale" || st.Connected || !strings.Contains(st.LastError, "unavailable") {
		t.Errorf("status = %+v", st)
	}
}

func TestCorruptSnapshotIsSetAside(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "routing.json")
	if err := os.WriteFile(snap, []byte(`{"format":1,"services":[{"kind":"nope"`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := projection.New(projection.Config{SnapshotPath: snap, Connect: func(context.Context) (*store.Store, error) {
		return nil, errors.New("unused")
	}})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status()
	if !strings.Contains(st.LastError, "reading routing snapshot") || !strings.Contains(st.LastError, ".bad") {
		t.Errorf("status error = %q", st.LastError)
	}
	if _, err := os.Stat(snap + ".bad"); err != nil {
		t.Errorf("corrupt snapshot not kept aside: %v", err)
	}
	if st.State != "starting" || !p.View().Stale {
		t.Errorf("status = %+v", st)
	}
	// A snapshot from a newer format is refused the same way.
	if err := os.WriteFile(snap, []byte(`{"format":7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = projection.New(projection.Config{SnapshotPath: snap, Connect: func(context.Context) (*store.Store, error) { return nil, errors.New("unused") }})
	if e := p.Status().LastError; !strings.Contains(e, "format 7") {
		t.Errorf("newer format error = %q", e)
	}
	if _, err := projection.New(projection.Config{}); err == nil {
		t.Error("New without a store or Connect succeeded")
	}
}

func TestReconnectContinuousResumesWithoutRebuild(t *testing.T) {
	dir, addr := t.TempDir(), storetest.FreeAddr(t)
	srv := storetest.StartIn(t, dir, addr)
	ctx := ctxT(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9001, "w1")})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	waitSeq(t, p.Projection, seq)

	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, wait, "projection to notice NATS is gone", func() bool { return !p.Status().Connected })
	if st := p.Status(); st.State != "serving-stale" || !p.View().Stale {
		t.Errorf("while NATS is down: %+v", st)
	}
	if s, ok := p.View().Lookup("shop.example.com", "/"); !ok || endpointIDs(s) != "w1" {
		t.Fatal("stopped serving the last good view while NATS is down")
	}

	srv2 := storetest.StartIn(t, dir, addr)
	storetest.Eventually(t, wait, "reconnect", func() bool { return p.Status().Connected && !p.View().Stale })
	_, seq, err = storetest.Deploy(ctx, srv2.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9002, "w2")})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "w2" {
		t.Errorf("after reconnect: %s", endpointIDs(s))
	}
	if r := p.Status().Rebuilds; r != 0 {
		t.Errorf("a continuous reconnect caused %d rebuilds", r)
	}
}

// While a gateway is away, a service is redeployed more often than the
// stream keeps events per subject: the gateway catches up from its position
// to the service's latest event without a rebuild, serving all along.
func TestCatchUpAcrossReplacedEvents(t *testing.T) {
	dir, addr := t.TempDir(), storetest.FreeAddr(t)
	srv := storetest.StartIn(t, dir, addr)
	ctx := ctxT(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9001, "w1")})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	waitSeq(t, p.Projection, seq)
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, wait, "projection to notice NATS is gone", func() bool { return !p.Status().Connected })

	// The same store, on another port the gateway does not know.
	side := storetest.StartIn(t, dir, storetest.FreeAddr(t))
	for i := 2; i < 2+2*store.RoutingHistory; i++ {
		if _, seq, err = storetest.Deploy(ctx, side.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9000+i, "w"+itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	side.NATS.Shutdown()
	side.NATS.WaitForShutdown()
	if s, ok := p.View().Lookup("shop.example.com", "/"); !ok || endpointIDs(s) != "w1" {
		t.Fatal("view lost while NATS was away")
	}
	storetest.StartIn(t, dir, addr)
	waitSeq(t, p.Projection, seq)
	last := "w" + itoa(1+2*store.RoutingHistory)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != last {
		t.Errorf("after catching up: %s, want %s", endpointIDs(s), last)
	}
	if st := p.Status(); st.Rebuilds != 0 || st.Signatures.Refused != 0 {
		t.Errorf("catching up rebuilt %d times, refused %d events", st.Rebuilds, st.Signatures.Refused)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestRecreatedStreamRebuilds(t *testing.T) {
	addr := storetest.FreeAddr(t)
	srv := storetest.StartIn(t, t.TempDir(), addr)
	ctx := ctxT(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9001, "w1")})
	if err != nil {
		t.Fatal(err)
	}
	// More events, so the gateway's position is past what a fresh stream
	// will hold.
	for i := 0; i < 5; i++ {
		if seq, err = storetest.SetInstance(ctx, srv.Store, "shop", "w1", store.InstanceReady, ""); err != nil {
			t.Fatal(err)
		}
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	waitSeq(t, p.Projection, seq)
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, wait, "projection to notice NATS is gone", func() bool { return !p.Status().Connected })

	// NATS comes back with an empty store (a new cluster, a lost disk, the
	// same auth dir): the stream restarts at sequence 1 and must not be
	// taken for a continuation.
	dir2 := t.TempDir()
	storetest.ShareTrustRoot(t, srv, dir2)
	srv2 := storetest.StartIn(t, dir2, addr)
	if _, _, err := storetest.Deploy(ctx, srv2.Store, "fresh", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"fresh.test"}}}, Instances: []storetest.Instance{{ID: "f1", Machine: "m1", Address: "127.0.0.1", Port: 9100}}},
	}); err != nil {
		t.Fatal(err)
	}
	// The gateway may come back before or after the new deploy lands;
	// either way it must end up with exactly the new store's state.
	storetest.Eventually(t, wait, "rebuild from the new stream", func() bool {
		_, ok := p.View().Lookup("fresh.test", "/")
		return p.Status().Rebuilds >= 1 && ok
	})
	if _, ok := p.View().Lookup("shop.example.com", "/"); ok {
		t.Error("shop.example.com still routed though the new store has no such deploy")
	}
}

// A projection follows routing published in sealed batches: every event
// applied (the seals are not events), none refused. A seal nobody
// certified vouches for nothing: the unsigned event after it is refused
// and its service keeps its last good state.
func TestSealedBatchesAreFollowed(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	if _, err := storetest.AdmitMachine(ctx, srv.Store, "m1", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	evs := make([]store.RoutingEvent, store.SealMax+40)
	for i := range evs {
		evs[i] = store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "bulk", Service: "s" + itoa(i),
			Routes:    []store.Route{{Hosts: []string{"s" + itoa(i) + ".bulk.test"}}},
			Endpoints: []store.Endpoint{{InstanceID: "i" + itoa(i), Machine: "m1", Address: "127.0.0.1", Port: 9000}}}
	}
	seq, err := srv.Store.PublishRouting(ctx, "bulk", evs)
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if st := p.Status(); st.EventsApplied != uint64(len(evs))+1 || st.Signatures.Refused != 0 || st.BadEvents != 0 {
		t.Fatalf("applied %d of %d, refused %d, bad %d", st.EventsApplied, len(evs), st.Signatures.Refused, st.BadEvents)
	}
	if _, ok := p.View().Lookup("s"+itoa(len(evs)-1)+".bulk.test", "/"); !ok {
		t.Fatal("the last sealed event's route is not served")
	}

	// A forged seal, then an unsigned event it claims to cover.
	forged := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "bulk", Service: "s0",
		Routes:    []store.Route{{Hosts: []string{"s0.bulk.test"}}},
		Endpoints: []store.Endpoint{{InstanceID: "evil", Machine: "m1", Address: "203.0.113.9", Port: 80}}}
	body, _ := json.Marshal(forged)
	subj := srv.Store.Names.RoutingServiceSubject("bulk", "s0")
	d := (&signing.Message{Subject: subj, Seq: seq + 2, Body: body}).Digest()
	sealBody, _ := json.Marshal(store.RoutingSeal{Version: 1, First: seq + 2, Digests: [][]byte{d[:]}})
	stranger, _ := signing.NewSigner()
	sealSubj := srv.Store.Names.RoutingSealSubject()
	for _, m := range []*nats.Msg{
		{Subject: sealSubj, Data: sealBody, Header: nats.Header{signing.Header: {stranger.Sign(signing.Message{Subject: sealSubj, Seq: seq + 1, Body: sealBody})}}},
		{Subject: subj, Data: body},
	} {
		if _, err := srv.Store.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	waitSeq(t, p.Projection, seq+2)
	if st := p.Status(); st.Signatures.Refused != 1 {
		t.Fatalf("refused %d, want the unsigned event", st.Signatures.Refused)
	}
	if s, ok := p.View().Service("bulk", "s0"); !ok || endpointIDs(s) != "i0" {
		t.Fatalf("bulk/s0 changed by an event a forged seal covered: %v", s)
	}
}
