package caddymodule

import (
	"context"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// Draining. A gateway about to be replaced by a new process on the same
// ports (`caddy supervise`) is first told to drain with SIGUSR2: from then
// on every response it routes carries "Connection: close", so each client
// connection ends cleanly after the response it is waiting for and the
// client reconnects, reaching either process, instead of having an idle
// keep-alive connection closed under a request it is sending when the old
// process stops. Caddy itself only logs SIGUSR2.
var draining atomic.Bool

// DrainSignal is the signal that starts draining.
var DrainSignal = syscall.SIGUSR2

// watchDrain sets draining when DrainSignal arrives, until ctx ends.
func watchDrain(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, DrainSignal)
	defer signal.Stop(ch)
	select {
	case <-ch:
		draining.Store(true)
	case <-ctx.Done():
	}
}

// markDraining asks the client to close its connection after this
// response while the process drains.
func markDraining(w http.ResponseWriter) {
	if draining.Load() {
		w.Header().Set("Connection", "close")
	}
}
