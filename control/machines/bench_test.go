package machines_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkList10k is `control machine ls` of a fleet of 10,000 machines:
// their records, states and heartbeats read from a real embedded store,
// no machine asked (issue goal: ≤ 1 s).
func BenchmarkList10k(b *testing.B) {
	const n = 10_000
	srv := storetest.Start(b)
	s := srv.Store
	ctx := context.Background()
	now := time.Now().UTC()
	sMachines := storetest.Bucket(b, s, s.Names.MachinesBucket())
	for i := range n {
		id := fmt.Sprintf("m%05d", i)
		rec := store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive, Address: "10.100.0.1",
			Region: "eu", Labels: map[string]string{"tier": "edge"}, JoinedAt: now, UpdatedAt: now}
		if _, err := store.PutJSON(ctx, sMachines, id, &rec); err != nil {
			b.Fatal(err)
		}
		if err := s.PutMachineState(ctx, &store.MachineState{Machine: id, Instances: 3, Free: 253, Capacity: 256,
			ByState: map[string]int{string(store.InstanceReady): 3}, Drivers: []string{"process"}, StartedAt: now}); err != nil {
			b.Fatal(err)
		}
		if err := s.PutMachineBeat(ctx, id, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		list, err := machines.List(ctx, s, false, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(list) != n || list[n-1].Liveness != store.MachineFresh || list[n-1].Instances != 3 {
			b.Fatalf("%d machines, last %+v", len(list), list[len(list)-1])
		}
	}
}
