package logs

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// syncBuffer is a bytes.Buffer a follow writes to while the test reads.
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

// Lines from every gateway of the service, kept by the store's
// access-log stream, printed oldest first with their sampling share when
// less than all; another service's lines are not; -o json prints them as
// published; a follow prints new lines as they come.
func TestTailAccessReadsEveryGateway(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	publish := func(l store.AccessLine) {
		t.Helper()
		b, _ := json.Marshal(l)
		if err := s.NC.Publish(s.Names.AccessSubject(l.Namespace, l.Service, l.Gateway), b); err != nil {
			t.Fatal(err)
		}
		if err := s.NC.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2026, 11, 27, 23, 0, 0, 0, time.UTC)
	line := func(gw, svc, id string, sample float64) store.AccessLine {
		return store.AccessLine{At: at, Gateway: gw, Namespace: "shop", Service: svc, Instance: "web-1", Method: "GET",
			Host: "shop.example", Path: "/cart", Status: 200, Duration: 0.0123, RequestID: id, Sample: sample}
	}
	publish(line("gw1", "web", "r1", 1))
	publish(line("gw2", "web", "r2", 0.25))
	publish(line("gw1", "api", "r3", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	storetest.Eventually(t, 5*time.Second, "the stream to keep three lines", func() bool {
		str, err := s.JS.Stream(ctx, s.Names.AccessLogsStream())
		if err != nil {
			return false
		}
		info, err := str.Info(ctx)
		return err == nil && info.State.Msgs == 3
	})

	var out bytes.Buffer
	if err := Tail(ctx, s, &out, Options{Access: true, Namespace: "shop", Service: "web", Since: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	want := "2026-11-27T23:00:00.000Z gw1 200 GET shop.example/cart 12.3ms rid=r1 instance=web-1\n" +
		"2026-11-27T23:00:00.000Z gw2 200 GET shop.example/cart 12.3ms rid=r2 instance=web-1 sampled=0.25\n"
	if out.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := Tail(ctx, s, &out, Options{Access: true, Namespace: "shop", Service: "web", JSON: true}); err != nil {
		t.Fatal(err)
	}
	if ls := strings.Split(strings.TrimSpace(out.String()), "\n"); len(ls) != 2 || !strings.Contains(ls[1], `"request_id":"r2"`) || !strings.Contains(ls[1], `"sample":0.25`) {
		t.Fatalf("-o json: %q", out.String())
	}

	out.Reset()
	if err := Tail(ctx, s, &out, Options{Access: true, Namespace: "shop", Service: "web", Instance: "web-2"}); err != nil || out.Len() != 0 {
		t.Fatalf("another instance's lines: %q %v", out.String(), err)
	}

	fctx, stop := context.WithCancel(ctx)
	var follow syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Tail(fctx, s, &follow, Options{Access: true, Namespace: "shop", Service: "web", Follow: true})
	}()
	storetest.Eventually(t, 5*time.Second, "the follow to print the kept lines", func() bool { return strings.Count(follow.String(), "\n") == 2 })
	publish(line("gw3", "web", "r4", 1))
	storetest.Eventually(t, 5*time.Second, "the follow to print a new line", func() bool { return strings.Contains(follow.String(), "gw3 200 GET shop.example/cart 12.3ms rid=r4") })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("a follow ended by its context: %v", err)
	}
}
