package enroll_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A box switching to renewed credentials keeps answering: requests to its
// responder sent all through two switches (each a reconnect) are every one
// answered, none lost in the hand-over to the bridge and back.
func TestRenewalAnswersEveryRequest(t *testing.T) {
	f := startRenewing(t, 6*time.Second)
	ctx := t.Context()
	_, s := f.joinedBox(t)
	names := s.Names
	stopServe, err := store.Serve(ctx, s.NC, names.NodeListenSubject("m1"), names.NodeQueueGroup("m1"), "node.m1",
		func(ctx context.Context, command string, data []byte) (any, error) {
			var n int
			err := json.Unmarshal(data, &n)
			return n, err
		})
	if err != nil {
		t.Fatal(err)
	}
	defer stopServe()
	renewing(t, s)

	renewals := func() int {
		list, _ := f.node.Store.ListCredentials(ctx, "m1", storagenode.RoleAgent)
		n := 0
		for _, c := range list {
			if c.How == store.IssuedByRenewal && !c.RevokedAt.IsZero() {
				n++
			}
		}
		return n
	}
	var asked, lost atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := w*1_000_000 + i
				sent := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				var got int
				err := f.node.Store.Call(cctx, "m1", store.CmdReadiness, n, &got)
				cancel()
				asked.Add(1)
				if err != nil || got != n {
					lost.Add(1)
					t.Logf("lost one sent at %s: %v", sent.Format("15:04:05.000"), err)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	// Two switches retired (each a renewal that renewed in turn), then stop.
	storeEventually(t, 20*time.Second, "two renewals switched to and retired", func() bool { return renewals() >= 1 && asked.Load() > 0 })
	storeEventually(t, 20*time.Second, "a second renewal", func() bool {
		list, _ := f.node.Store.ListCredentials(ctx, "m1", storagenode.RoleAgent)
		n := 0
		for _, c := range list {
			if c.How == store.IssuedByRenewal {
				n++
			}
		}
		return n >= 3
	})
	close(stop)
	wg.Wait()
	list, _ := f.node.Store.ListCredentials(ctx, "m1", storagenode.RoleAgent)
	for _, c := range list {
		t.Logf("key %s issued %s revoked %s", c.User[:6], c.IssuedAt.Format("15:04:05.000"), c.RevokedAt.Format("15:04:05.000"))
	}
	t.Logf("%d requests across the switches, %d unanswered", asked.Load(), lost.Load())
	if lost.Load() > 0 {
		t.Fatalf("%d of %d requests unanswered while the box switched keys; first: %v", lost.Load(), asked.Load(), firstErr.Load())
	}
}
