package deploy

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// syncBuffer is a deploy's output, read by the test while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func putObservation(t *testing.T, s *store.Store, o store.GatewayObservation) {
	t.Helper()
	o.At = time.Now().UTC()
	if err := s.PutGatewayObservation(context.Background(), &o); err != nil {
		t.Fatal(err)
	}
}

// A deploy waits for the gateways that serve its routing to stop listing
// what it stops as draining; a gateway behind the routing, another
// namespace's instance of the same name and an instance nobody waits for
// do not hold it.
func TestWaitLayer4DrainsEndsWhenTheGatewaysDrained(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	out := &syncBuffer{}
	d := New(s, Options{Out: out})
	drain := func(ids ...string) []store.L4Drain {
		var out []store.L4Drain
		for _, id := range ids {
			out = append(out, store.L4Drain{Namespace: "shop", Service: "db", Instance: id, Conns: 2, Until: time.Now().Add(time.Minute)})
		}
		return out
	}
	putObservation(t, s, store.GatewayObservation{Gateway: "g1", AppliedSeq: 10, L4Draining: drain("i1")})
	// Behind the deploy's routing: not waited for.
	putObservation(t, s, store.GatewayObservation{Gateway: "g2", AppliedSeq: 9, L4Draining: drain("i1", "i2")})
	// Another namespace's i2, and an instance the deploy does not stop.
	putObservation(t, s, store.GatewayObservation{Gateway: "g3", AppliedSeq: 11,
		L4Draining: []store.L4Drain{{Namespace: "other", Service: "db", Instance: "i2", Conns: 1}, {Namespace: "shop", Service: "db", Instance: "i9", Conns: 1}}})
	stops := map[string]l4Stop{"i1": {service: "db", bound: 20 * time.Second}, "i2": {service: "db", bound: 20 * time.Second}}
	start := time.Now()
	done := make(chan []string, 1)
	go func() { done <- d.waitLayer4Drains(context.Background(), "shop", 10, stops) }()
	// g1 still lists i1: the wait goes on.
	select {
	case got := <-done:
		t.Fatalf("the wait ended while g1 drains i1: %v", got)
	case <-time.After(500 * time.Millisecond):
	}
	// g1 moves on and lists i2 now; then drains it too.
	putObservation(t, s, store.GatewayObservation{Gateway: "g1", AppliedSeq: 12, L4Draining: drain("i2")})
	select {
	case got := <-done:
		t.Fatalf("the wait ended while g1 drains i2: %v", got)
	case <-time.After(300 * time.Millisecond):
	}
	putObservation(t, s, store.GatewayObservation{Gateway: "g1", AppliedSeq: 12})
	select {
	case got := <-done:
		if len(got) != 0 {
			t.Fatalf("still draining after the gateways drained: %v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end when the gateways drained")
	}
	if el := time.Since(start); el < 800*time.Millisecond || el > 10*time.Second {
		t.Fatalf("waited %s", el)
	}
	for _, want := range []string{"waiting up to 20s for gateways' layer-4 connections to i1, i2 of shop/db to drain", "layer-4 connections drained after"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
}

// A drain that outlasts its bound ends the wait for that instance at the
// bound, and is returned (for the deploy's warning); nothing to wait for
// returns at once.
func TestWaitLayer4DrainsIsBounded(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	d := New(s, Options{})
	putObservation(t, s, store.GatewayObservation{Gateway: "g1", AppliedSeq: 5,
		L4Draining: []store.L4Drain{{Namespace: "shop", Service: "db", Instance: "i1", Conns: 3}}})
	start := time.Now()
	got := d.waitLayer4Drains(context.Background(), "shop", 5, map[string]l4Stop{"i1": {service: "db", bound: 1500 * time.Millisecond}})
	if el := time.Since(start); el < 1500*time.Millisecond || el > 4*time.Second {
		t.Fatalf("waited %s for a bound of 1.5s", el)
	}
	if len(got) != 1 || got[0] != "i1 of shop/db: 3 connections through gateway g1" {
		t.Fatalf("still draining: %q", got)
	}
	start = time.Now()
	if got := d.waitLayer4Drains(context.Background(), "shop", 5, nil); got != nil || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("nothing to wait for: %v after %s", got, time.Since(start))
	}
}

// The instances waited for are those of a service with layer-4 entry
// points in either commit, each bounded by the longer drain timeout plus
// the margin.
func TestLayer4Stops(t *testing.T) {
	prev := &store.Manifest{Services: map[string]store.ServiceSpec{
		"db":  {Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}}, DrainTimeout: store.Duration(time.Minute)}},
		"dns": {Layer4: store.Layer4{UDP: []store.L4Port{{Port: 53}}}},
		"web": {Routes: []store.Route{{Hosts: []string{"a.example.com"}}}},
	}}
	next := &store.Manifest{Services: map[string]store.ServiceSpec{
		"db":  {Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}}, DrainTimeout: store.Duration(2 * time.Minute)}},
		"web": {Layer4: store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{"a.example.com"}}}},
	}}
	got := layer4Stops(map[string]string{"d1": "db", "n1": "dns", "w1": "web", "j1": "job"}, prev, nil, next)
	want := map[string]l4Stop{
		"d1": {"db", 2*time.Minute + L4DrainMargin},
		"n1": {"dns", store.DefaultDrainTimeout + L4DrainMargin},
		"w1": {"web", store.DefaultDrainTimeout + L4DrainMargin},
	}
	if len(got) != len(want) {
		t.Fatalf("layer4Stops = %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Fatalf("layer4Stops = %v, want %v", got, want)
		}
	}
	if b := maxL4Bound(next); b != 2*time.Minute+L4DrainMargin {
		t.Fatalf("maxL4Bound = %s", b)
	}
	if b := maxL4Bound(&store.Manifest{Services: map[string]store.ServiceSpec{"web": {}}}); b != 0 {
		t.Fatalf("maxL4Bound without layer 4 = %s", b)
	}
}

// A manifest exposing layer-4 entry points is refused, naming the old
// gateways and the entry points, while a gateway before layer 4 is live;
// one without is not; once the gateway is upgraded both pass.
func TestLayer4RefusedWhileAGatewayIsTooOld(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.40.0", Generation: 4, At: time.Now().UTC()}
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.GatewaysBucket()), store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	l4 := &store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{
		"db":  {Command: []string{"db"}, Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}}, TLSPassthrough: &store.Passthrough{Hosts: []string{"db.example.com"}}}},
		"web": {Command: []string{"web"}},
	}}
	d := New(s, Options{})
	for _, call := range []func() error{
		func() error { _, err := d.Preview(ctx, l4); return err },
		func() error { _, err := d.Apply(ctx, l4); return err },
	} {
		se := store.AsError(call())
		if se == nil || se.Code != store.CodeVersionSkew || !strings.Contains(se.Message, "gateways gw-old (0.40.0) cannot serve layer-4 entry points (release 0.41.0 or later can)") ||
			se.Detail["entries"] != "services.db.tcp[0] (tcp/5432),services.db.tls_passthrough (tls passthrough db.example.com)" {
			t.Fatalf("with a 0.40.0 gateway live: %v (%+v)", se, se)
		}
	}
	if c, err := s.LiveCommit(ctx, "shop"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a refused apply committed %v (%v)", c, err)
	}
	if _, err := d.Preview(ctx, &store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {Command: []string{"web"}}}}); err != nil {
		t.Fatalf("no layer-4 entry point, old gateway: %v", err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Preview(ctx, l4); err != nil {
		t.Fatalf("every gateway current: %v", err)
	}
}
