package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestCallNoResponderIsRPCFailure(t *testing.T) {
	srv := storetest.Start(t)
	err := srv.Store.Call(context.Background(), "gone", "capacity", struct{}{}, nil)
	var f *store.RPCFailure
	if !errors.As(err, &f) || f.Machine != "gone" || f.Command != "capacity" || f.Cause != store.CauseNoResponders {
		t.Fatalf("got %v, want RPCFailure{gone, capacity, no_responders}", err)
	}
	if se := store.AsError(err); se.Code != store.CodeRPCFailure || se.Detail["machine"] != "gone" {
		t.Fatalf("structured form: %+v", se)
	}
}

func TestCallTimeoutIsRPCFailure(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	stop, err := store.Serve(ctx, srv.Store.NC, srv.Store.Names.NodeListenSubject("slow"),
		srv.Store.Names.NodeQueueGroup("slow"), "node.slow",
		func(ctx context.Context, command string, data []byte) (any, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	defer close(release)
	cctx, ccancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer ccancel()
	err = srv.Store.Call(cctx, "slow", "capacity", struct{}{}, nil)
	var f *store.RPCFailure
	if !errors.As(err, &f) || f.Cause != store.CauseTimeout {
		t.Fatalf("got %v, want a timeout RPCFailure", err)
	}
}

func TestServeRoundTripAndRemoteError(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := store.Serve(ctx, srv.Store.NC, srv.Store.Names.NodeListenSubject("m1"),
		srv.Store.Names.NodeQueueGroup("m1"), "node.m1",
		func(ctx context.Context, command string, data []byte) (any, error) {
			switch command {
			case "echo.command":
				return map[string]string{"command": command, "body": string(data)}, nil
			case "panic":
				panic("boom")
			}
			return nil, store.Errorf(store.CodeInvalid, "unknown command %s", command).With("command", command)
		})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var got map[string]string
	if err := srv.Store.Call(ctx, "m1", "echo.command", "hi", &got); err != nil {
		t.Fatal(err)
	}
	if got["command"] != "echo.command" || got["body"] != `"hi"` {
		t.Fatalf("echo: %v", got)
	}
	err = srv.Store.Call(ctx, "m1", "nope", nil, nil)
	if se := store.AsError(err); se.Code != store.CodeInvalid || se.Detail["command"] != "nope" {
		t.Fatalf("remote error: %v", err)
	}
	err = srv.Store.Call(ctx, "m1", "panic", nil, nil)
	if se := store.AsError(err); se.Code != store.CodeInternal {
		t.Fatalf("panicking handler: %v", err)
	}
}

// A responder answers only on inbox-style reply subjects: a request naming
// a stream subject or a lock key as its reply gets nothing written there.
func TestServeAnswersOnlyInboxes(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	names := srv.Store.Names
	stop, err := store.Serve(ctx, srv.Store.NC, names.NodeListenSubject("m1"), names.NodeQueueGroup("m1"), "node.m1",
		func(context.Context, string, []byte) (any, error) { return map[string]string{"answer": "yes"}, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	nc := srv.Conn(t)
	forged := "$KV." + names.LocksBucket() + ".cp.lock.deploy.shop"
	if err := nc.PublishRequest(names.RPCSubject("m1", "capacity"), forged, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// The same request with a real inbox is answered: the responder ran.
	if err := srv.Store.Call(ctx, "m1", "capacity", struct{}{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BucketOf(srv.Store, srv.Store.Names.LocksBucket()).Get(ctx, "cp.lock.deploy.shop"); err == nil {
		t.Fatal("a responder wrote its answer into the locks bucket")
	}
	for _, tc := range []struct {
		reply string
		ok    bool
	}{{"_INBOX.abc", true}, {"_INBOX.UABC.x", true}, {"_R_.x.y", true}, {forged, false}, {"cp.default.commits.shop.final", false}, {"", false}} {
		if got := store.ReplyOK(tc.reply); got != tc.ok {
			t.Errorf("ReplyOK(%q) = %v", tc.reply, got)
		}
	}
}
