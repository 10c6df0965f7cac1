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
