package fleet

// The flush: the summaries of the namespaces that changed, written when
// what they say changed, and the word that every summary is current.

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/edgeplane/edgeplane/store"
)

// flushWriters is how many summaries are written at once: a flush after a
// fleet-wide change writes one per namespace, and one at a time would
// take a round trip each. 16 at a time, a flush of 1,000 summaries on a
// busy storage node took most of the flush interval, and the status lag
// p99 went past a second whenever one took longer.
const flushWriters = 128

// refreshEvery is how old an unchanged summary gets before it is written
// anyway, to bring its Revision and Observed along for a reader of the
// store alone (FleetStatusFlushed tells one that follows at every flush).
// Summaries are synced writes: a namespace whose instances changed and
// came back, or changed in ways no summary shows, costs no write until
// then.
func (a *Aggregator) refreshEvery() time.Duration { return 10 * a.cfg.FlushEvery }

// flushing is one flush: the summaries to write, computed under a.mu,
// and what it says once they are written.
type flushing struct {
	out []store.NamespaceStatus
	// dirty is the dirty set the summaries were computed from, oldest
	// its oldest change.
	dirty  map[string]time.Time
	oldest time.Time
	told   store.FleetStatusFlushed
}

// prepareFlush computes the summaries of the namespaces that changed and
// say something new (and of those due a refresh), and takes them out of
// the dirty set: changes taken in from here on go to the next flush.
func (a *Aggregator) prepareFlush() *flushing {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	f := &flushing{out: make([]store.NamespaceStatus, 0, len(a.dirty)), dirty: a.dirty,
		told: store.FleetStatusFlushed{Revision: a.rev, Observed: a.obsRev, At: now.UTC()}}
	consider := func(ns string) {
		st := a.summary(ns)
		if prev, ok := a.flushed[ns]; ok && sameSummary(&prev, &st) && now.Sub(prev.UpdatedAt) < a.refreshEvery() {
			a.behind[ns] = true
			return
		}
		delete(a.behind, ns)
		f.out = append(f.out, st)
	}
	for ns, since := range a.dirty {
		consider(ns)
		if f.oldest.IsZero() || since.Before(f.oldest) {
			f.oldest = since
		}
	}
	for ns := range a.behind {
		if _, changed := a.dirty[ns]; !changed && now.Sub(a.flushed[ns].UpdatedAt) >= a.refreshEvery() {
			consider(ns)
		}
	}
	a.dirty = map[string]time.Time{}
	return f
}

// flush writes what prepareFlush computed, then says through which
// revisions every summary is current (store.FleetStatusFlushed). It
// takes a.mu only to note what it wrote: Run goes on taking in changes
// while the (synced) writes are under way.
func (a *Aggregator) flush(ctx context.Context, f *flushing) error {
	errs := make([]error, len(f.out))
	var g errgroup.Group
	g.SetLimit(flushWriters)
	for i := range f.out {
		g.Go(func() error {
			errs[i] = a.write(ctx, &f.out[i])
			return nil
		})
	}
	_ = g.Wait()

	var msgs []string
	a.mu.Lock()
	for i := range f.out {
		st := &f.out[i]
		switch {
		case errs[i] != nil:
			msgs = append(msgs, errs[i].Error())
			if since, changed := f.dirty[st.Namespace]; changed {
				// Written next time, as changed since its first change
				// (it may have changed again meanwhile).
				if cur, ok := a.dirty[st.Namespace]; !ok || since.Before(cur) {
					a.dirty[st.Namespace] = since
				}
			} else {
				a.behind[st.Namespace] = true // a refresh: tried again next time
			}
		case st.Counts.Total() == 0:
			delete(a.flushed, st.Namespace)
		default:
			a.flushed[st.Namespace] = *st
		}
	}
	if !f.oldest.IsZero() {
		a.lastLag = time.Since(f.oldest)
	}
	// Only a flush that wrote all it meant to makes every summary
	// current; one with nothing new to say says nothing.
	told := f.told
	say := len(msgs) == 0 && (told.Revision > a.told.Revision || told.Observed > a.told.Observed)
	if say {
		a.told = told
	}
	a.mu.Unlock()
	if say {
		if err := a.s.PublishFleetStatusFlushed(&told); err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) > 0 {
		slices.Sort(msgs)
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}

// sameSummary says whether a and b say the same of their namespace: all
// but when they were computed and the revisions they count up to.
func sameSummary(a, b *store.NamespaceStatus) bool {
	x, y := *a, *b
	x.Revision, x.Observed, x.UpdatedAt = 0, 0, time.Time{}
	y.Revision, y.Observed, y.UpdatedAt = 0, 0, time.Time{}
	return reflect.DeepEqual(x, y)
}

// write stores one summary, or deletes it once the namespace has no
// instances left.
func (a *Aggregator) write(ctx context.Context, st *store.NamespaceStatus) error {
	return a.s.PutNamespaceStatus(ctx, st)
}
