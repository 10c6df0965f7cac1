// Package logs reads the output of a service's instances from the machines
// that run them (the agents' logs.read RPC), assembling whole lines and
// following new output and new instances until told to stop.
package logs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// FollowEvery is how often Tail asks for more output when following.
const FollowEvery = 250 * time.Millisecond

// refreshEvery is how often a follow looks for instances that started
// since.
const refreshEvery = 2 * time.Second

// Options say whose output Tail prints.
type Options struct {
	Namespace, Service string
	// Instance, if set, is the only instance read.
	Instance string
	// Since, if set, starts each instance's output at that time (to about
	// a second); else each starts at its last 32 KiB.
	Since time.Time
	// Follow keeps printing output as it comes, also of instances that
	// start later, until ctx ends.
	Follow bool
	// Access prints the service's access lines from every gateway
	// instead (access.go); Since then defaults to DefaultAccessSince ago,
	// and Instance keeps the lines of requests it answered.
	Access bool
	// JSON prints access lines as published (one JSON object a line).
	JSON bool
}

// Tail writes the output of o's instances to w, one line at a time, each
// prefixed "[ID] " when there are several. An instance whose machine does
// not answer is named once per cause, and the others go on. It fails with
// not_found when no such instance runs.
func Tail(ctx context.Context, s *store.Store, w io.Writer, o Options) error {
	if o.Access {
		return tailAccess(ctx, s, w, o)
	}
	t := &tail{s: s, w: w, ns: o.Namespace, svc: o.Service, only: o.Instance, since: o.Since, cursors: map[string]*cursor{}}
	if err := t.refresh(ctx); err != nil {
		return err
	}
	if len(t.cursors) == 0 {
		what := o.Namespace + "/" + o.Service
		if o.Instance != "" {
			what = "instance " + o.Instance + " of " + what
		}
		return store.Errorf(store.CodeNotFound, "no %s runs", what).With("namespace", o.Namespace).With("service", o.Service)
	}
	t.drain(ctx, !o.Follow)
	if !o.Follow {
		return nil
	}
	tick := time.NewTicker(FollowEvery)
	defer tick.Stop()
	lastRefresh := time.Now()
	for {
		select {
		case <-ctx.Done():
			t.flush()
			return nil
		case <-tick.C:
		}
		if time.Since(lastRefresh) > refreshEvery {
			_ = t.refresh(ctx) // the store away for a moment: keep what we have
			lastRefresh = time.Now()
		}
		t.drain(ctx, false)
	}
}

// tail reads the output of a service's instances from their machines.
type tail struct {
	s       *store.Store
	w       io.Writer
	ns, svc string
	only    string
	since   time.Time
	cursors map[string]*cursor
	// warned keeps one warning per instance and cause.
	warned map[string]bool
}

// cursor is how far one instance's output was read.
type cursor struct {
	rec  store.InstanceRecord
	next int64 // -1: not read yet
	// partial is a line without its end yet.
	partial []byte
}

// refresh finds the service's instances (new ones start from their
// beginning, or since).
func (t *tail) refresh(ctx context.Context) error {
	return t.s.ListInstances(ctx, store.NamespaceInstancesFilter(t.ns), func(_ string, r *store.InstanceRecord) error {
		if r.Service != t.svc || (t.only != "" && r.ID != t.only) {
			return nil
		}
		if _, ok := t.cursors[r.ID]; !ok {
			t.cursors[r.ID] = &cursor{rec: *r, next: -1}
		}
		return nil
	})
}

// drain reads what each instance has beyond its cursor; once reads one
// chunk each (a bounded tail).
func (t *tail) drain(ctx context.Context, once bool) {
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

func (t *tail) prefix(id string) string {
	if len(t.cursors) > 1 {
		return "[" + id + "] "
	}
	return ""
}

// print writes the complete lines of data, keeping a trailing partial one.
func (t *tail) print(cur *cursor, data []byte) {
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

func (t *tail) flushOne(cur *cursor) {
	if len(cur.partial) > 0 {
		fmt.Fprintf(t.w, "%s%s\n", t.prefix(cur.rec.ID), cur.partial)
		cur.partial = nil
	}
}

func (t *tail) flush() {
	for _, cur := range t.cursors {
		t.flushOne(cur)
	}
}

func (t *tail) warn(id string, err error) {
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
