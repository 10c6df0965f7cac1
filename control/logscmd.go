package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// logFollowEvery is how often `control logs -f` asks for more output.
const logFollowEvery = 250 * time.Millisecond

func setupLogs(fs *flag.FlagSet) func(*call) error {
	instance := fs.String("instance", "", "only this instance")
	follow := fs.Bool("f", false, "keep printing output as it comes (until Ctrl-C), also of instances that start later")
	since := fs.Duration("since", 0, "output of the last DURATION (to about a second; default: the last 32 KiB of each instance)")
	return func(c *call) error {
		ns, svc, ok := strings.Cut(c.args[0], "/")
		if !ok || !store.ValidToken(ns) || !store.ValidToken(svc) {
			return usagef("want NAMESPACE/SERVICE, got %q", c.args[0])
		}
		return c.withStore(func(s *store.Store) error {
			t := &logTail{s: s, w: c.stdout, ns: ns, svc: svc, only: *instance, cursors: map[string]*logCursor{}}
			if *since > 0 {
				t.since = time.Now().Add(-*since)
			}
			if err := t.refresh(c.ctx); err != nil {
				return err
			}
			if len(t.cursors) == 0 {
				what := ns + "/" + svc
				if *instance != "" {
					what = "instance " + *instance + " of " + what
				}
				return store.Errorf(store.CodeNotFound, "no %s runs", what).With("namespace", ns).With("service", svc)
			}
			t.drain(c.ctx, !*follow)
			if !*follow {
				return nil
			}
			tick := time.NewTicker(logFollowEvery)
			defer tick.Stop()
			lastRefresh := time.Now()
			for {
				select {
				case <-c.ctx.Done():
					t.flush()
					return nil
				case <-tick.C:
				}
				if time.Since(lastRefresh) > 2*time.Second {
					_ = t.refresh(c.ctx) // the store away for a moment: keep what we have
					lastRefresh = time.Now()
				}
				t.drain(c.ctx, false)
			}
		})
	}
}

// logTail reads the output of a service's instances from their machines.
type logTail struct {
	s       *store.Store
	w       io.Writer
	ns, svc string
	only    string
	since   time.Time
	cursors map[string]*logCursor
	// warned keeps one warning per instance and cause.
	warned map[string]bool
}

// logCursor is how far one instance's output was read.
type logCursor struct {
	rec  store.InstanceRecord
	next int64 // -1: not read yet
	// partial is a line without its end yet.
	partial []byte
}

// refresh finds the service's instances (new ones start from their
// beginning, or since).
func (t *logTail) refresh(ctx context.Context) error {
	return store.ListJSON(ctx, t.s, t.s.Instances, store.NamespaceInstancesFilter(t.ns), func(_ string, r *store.InstanceRecord) error {
		if r.Service != t.svc || (t.only != "" && r.ID != t.only) {
			return nil
		}
		if _, ok := t.cursors[r.ID]; !ok {
			t.cursors[r.ID] = &logCursor{rec: *r, next: -1}
		}
		return nil
	})
}

// drain reads what each instance has beyond its cursor; once reads one
// chunk each (a bounded tail).
func (t *logTail) drain(ctx context.Context, once bool) {
	ids := make([]string, 0, len(t.cursors))
	for id := range t.cursors {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		cur := t.cursors[id]
		for {
			req := store.LogsRequest{InstanceID: id, Namespace: t.ns, Offset: cur.next}
			if cur.next < 0 {
				req.Since = t.since
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var rep store.LogsReply
			err := t.s.Call(rctx, cur.rec.Machine, store.CmdLogs, req, &rep)
			cancel()
			if err != nil {
				t.warn(id, err)
				break
			}
			if cur.next >= 0 && rep.Offset < cur.next {
				fmt.Fprintf(t.w, "[%s] (output truncated; from its start)\n", id)
				cur.partial = nil
			}
			if cur.next < 0 && rep.Offset > 0 && t.since.IsZero() {
				// A tail from the middle of a line: start at the next one.
				if i := bytes.IndexByte(rep.Data, '\n'); i >= 0 {
					rep.Data = rep.Data[i+1:]
				}
			}
			cur.next = rep.Next
			t.print(cur, rep.Data)
			if once || len(rep.Data) < store.MaxLogChunk {
				break
			}
		}
		if once {
			t.flushOne(cur)
		}
	}
}

func (t *logTail) prefix(id string) string {
	if len(t.cursors) > 1 {
		return "[" + id + "] "
	}
	return ""
}

// print writes the complete lines of data, keeping a trailing partial one.
func (t *logTail) print(cur *logCursor, data []byte) {
	buf := append(cur.partial, data...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(t.w, "%s%s\n", t.prefix(cur.rec.ID), buf[:i])
		buf = buf[i+1:]
	}
	cur.partial = append([]byte(nil), buf...)
}

func (t *logTail) flushOne(cur *logCursor) {
	if len(cur.partial) > 0 {
		fmt.Fprintf(t.w, "%s%s\n", t.prefix(cur.rec.ID), cur.partial)
		cur.partial = nil
	}
}

func (t *logTail) flush() {
	for _, cur := range t.cursors {
		t.flushOne(cur)
	}
}

func (t *logTail) warn(id string, err error) {
	if t.warned == nil {
		t.warned = map[string]bool{}
	}
	se := store.AsError(err)
	key := id + "/" + se.Code
	if t.warned[key] {
		return
	}
	t.warned[key] = true
	fmt.Fprintf(t.w, "[%s] (output unavailable: %s)\n", id, se.Message)
}
