// Command hello is the example app of edgeplane's README and tests: a tiny
// HTTP server that says which instance answered. It listens on $HOST:$PORT
// as every instance must. / answers with its service, slot, revision and
// machine; /healthz is its readiness check.
//
// For tests, HELLO_READY=fail makes /healthz answer 503 forever,
// HELLO_READY_DELAY=2s delays readiness after start, HELLO_EXIT_AFTER=2s
// makes it exit with status 3 that long after start, VERSION is echoed
// in its JSON answer, /log?line=TEXT prints TEXT to its output, and
// /stream?lines=N streams N lines naming the instance, one every 200 ms (a
// long-lived response), /ws is a websocket that answers each message
// with the instance's ID, a space and the message, and /status/CODE
// answers with that status (a misbehaving instance). HELLO_FAIL_EVERY=N
// makes every Nth answer of / a 500 (a bad release), and HELLO_DELAY=D
// delays every answer of / by D (a slow one).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/websocket"
)

func main() {
	addr := net.JoinHostPort(envOr("HOST", "127.0.0.1"), envOr("PORT", "8000"))
	info := map[string]string{
		"service":   os.Getenv("EDGEPLANE_SERVICE"),
		"namespace": os.Getenv("EDGEPLANE_NAMESPACE"),
		"slot":      os.Getenv("EDGEPLANE_SLOT"),
		"revision":  os.Getenv("EDGEPLANE_REVISION"),
		"machine":   os.Getenv("EDGEPLANE_MACHINE"),
		"instance":  os.Getenv("EDGEPLANE_INSTANCE"),
		"version":   os.Getenv("VERSION"),
	}
	readyAt := time.Now()
	if d, err := time.ParseDuration(os.Getenv("HELLO_READY_DELAY")); err == nil {
		readyAt = readyAt.Add(d)
	}
	failReady := os.Getenv("HELLO_READY") == "fail"
	if d, err := time.ParseDuration(os.Getenv("HELLO_EXIT_AFTER")); err == nil {
		time.AfterFunc(d, func() {
			log.Printf("exiting after %s as HELLO_EXIT_AFTER asks", d)
			os.Exit(3)
		})
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if failReady || time.Now().Before(readyAt) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/log", func(w http.ResponseWriter, r *http.Request) {
		log.Print(r.URL.Query().Get("line"))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("lines"))
		if err != nil || n <= 0 {
			n = 10
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		flusher, _ := w.(http.Flusher)
		for i := range n {
			fmt.Fprintf(w, "%s %d\n", info["instance"], i)
			if flusher != nil {
				flusher.Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	// Any origin: hello is reached through gateways under any host.
	mux.Handle("/ws", websocket.Server{Handler: func(ws *websocket.Conn) {
		for {
			var msg string
			if err := websocket.Message.Receive(ws, &msg); err != nil {
				return
			}
			if err := websocket.Message.Send(ws, info["instance"]+" "+msg); err != nil {
				return
			}
		}
	}})
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.PathValue("code"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, "status must be a number from 200 to 599", http.StatusBadRequest)
			return
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "%d from %s\n", code, info["instance"])
	})
	failEvery, _ := strconv.ParseUint(os.Getenv("HELLO_FAIL_EVERY"), 10, 64)
	delay, _ := time.ParseDuration(os.Getenv("HELLO_DELAY"))
	var served atomic.Uint64
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if n := served.Add(1); failEvery > 0 && n%failEvery == 0 {
			http.Error(w, "failing as HELLO_FAIL_EVERY asks", http.StatusInternalServerError)
			return
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		if r.URL.Query().Get("format") == "json" || r.Header.Get("Accept") == "application/json" {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(info)
			return
		}
		fmt.Fprintf(w, "hello from %s.%s slot %s revision %s on %s (%s)\n",
			info["service"], info["namespace"], info["slot"], info["revision"], info["machine"], info["instance"])
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Printf("hello listening on %s", addr)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
