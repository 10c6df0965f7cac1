package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A swap that only flips a flag of the view (the machines judged down)
// while events are applied never puts back a view an event replaced: the
// applied sequence never goes back, and the last event stays applied.
func TestFlagSwapsNeverPutBackAnOlderView(t *testing.T) {
	srv := storetest.Start(t)
	st := srv.Store
	p, err := projection.New(projection.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	projection.Unverified(p)
	const n = 3000
	msgs := make([]*store.StoredMsg, n)
	for i := range msgs {
		m := &store.MachineRecord{Version: store.RecordVersion, ID: fmt.Sprintf("m%d", i), State: store.MachineActive, Address: "10.0.0.1"}
		data, err := json.Marshal(store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventMachineUpsert, Machine: m})
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = &store.StoredMsg{Seq: uint64(i + 1), Subject: st.Names.RoutingMachineSubject(m.ID), Data: data}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var regressed atomic.Value
	wg.Add(2)
	go func() { // judgements come and go
		defer wg.Done()
		down := map[string]projection.MachineDown{"m0": {Liveness: "offline"}}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				projection.SetDown(p, down)
			} else {
				projection.SetDown(p, nil)
			}
		}
	}()
	go func() { // a reader watching the applied sequence
		defer wg.Done()
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			if seq := p.View().Seq; seq < last {
				regressed.CompareAndSwap(nil, fmt.Sprintf("the view went back from %d to %d", last, seq))
			} else {
				last = seq
			}
		}
	}()
	ctx := context.Background()
	for i := range msgs {
		if err := projection.ApplyStored(ctx, p, st, msgs[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if r := regressed.Load(); r != nil {
		t.Error(r)
	}
	if v := p.View(); v.Seq != n {
		t.Errorf("after %d events the view is at %d", n, v.Seq)
	}
}
