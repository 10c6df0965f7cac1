package agent

import (
	"context"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// ObservedWriter writes one machine's observations, coalescing: a change
// is written by the next write that starts after it was made, and changes
// made while a write is under way go together in the one after it. Idle,
// a change is written at once; busy, every change waits for at most one
// write before its own.
type ObservedWriter struct {
	s       *store.Store
	machine string
	// snapshot returns what the machine observes now, in a map the
	// writer may keep.
	snapshot func() map[string]store.ObservedInstance

	mu sync.Mutex
	// asked counts Flush calls; covered is the highest asked an
	// acknowledged write took its snapshot after, rev that write's revision.
	asked, covered uint64
	rev            uint64
	// writing is closed when the write under way ends; nil when none is.
	writing chan struct{}
	// failed says the last write failed.
	failed bool
}

// NewObservedWriter returns the writer of machine's observations, which
// snapshot reads.
func NewObservedWriter(s *store.Store, machine string, snapshot func() map[string]store.ObservedInstance) *ObservedWriter {
	return &ObservedWriter{s: s, machine: machine, snapshot: snapshot}
}

// Flush returns once a write that took its snapshot after Flush was called
// is acknowledged, with that write's revision: what the caller changed
// before is then in the store. A write that fails fails the callers that
// waited for it; the next Flush writes again (Behind says one is due).
func (w *ObservedWriter) Flush(ctx context.Context) (uint64, error) {
	w.mu.Lock()
	w.asked++
	mine := w.asked
	for {
		if w.covered >= mine {
			rev := w.rev
			w.mu.Unlock()
			return rev, nil
		}
		if w.writing == nil {
			done := make(chan struct{})
			w.writing = done
			upto := w.asked
			w.mu.Unlock()
			rev, err := w.write(ctx)
			w.mu.Lock()
			w.writing, w.failed = nil, err != nil
			close(done)
			if err != nil {
				w.mu.Unlock()
				return 0, err
			}
			if upto > w.covered {
				w.covered, w.rev = upto, rev
			}
			continue
		}
		// Wait for the write under way; it may have started before this
		// change, so another follows unless one already covers it.
		done := w.writing
		w.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		w.mu.Lock()
	}
}

// Behind says whether the last write failed, leaving a change no
// acknowledged write covers.
func (w *ObservedWriter) Behind() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed && w.covered < w.asked
}

func (w *ObservedWriter) write(ctx context.Context) (uint64, error) {
	insts := w.snapshot()
	if insts == nil {
		insts = map[string]store.ObservedInstance{}
	}
	return w.s.PutObserved(ctx, &store.MachineObserved{Machine: w.machine, Instances: insts, UpdatedAt: time.Now().UTC()})
}
