package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/enginetest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkApply measures an apply that replaces one instance on each of N
// machines (real agents in this process, real hello processes, real NATS).
// overhead-ms is the control plane's own time: the whole apply minus the
// candidates step (process start and readiness) and minus the drain step
// (stopping old processes), which belong to the instances, not to us.
func BenchmarkApply(b *testing.B) {
	hello := buildHello(b)
	benchApply(b, nil, func(spec *store.ServiceSpec) { spec.Command = []string{hello} })
}

// BenchmarkApplyContainers is BenchmarkApply with the instances in
// containers of a real podman (each apply replaces every container).
func BenchmarkApplyContainers(b *testing.B) {
	e := enginetest.Start(b, enginetest.Podman)
	hello := enginetest.BuildStatic(b, "github.com/edgeplane/edgeplane/examples/hello", b.TempDir())
	tag := fmt.Sprintf("localhost/edgeplane-bench-%d:v1", time.Now().UnixNano())
	e.BuildImage(b, tag, hello)
	ctr, err := runtime.ConnectEngine(context.Background(), e.Host)
	if err != nil {
		b.Fatal(err)
	}
	defer ctr.Close()
	benchApply(b, ctr, func(spec *store.ServiceSpec) { spec.Image = tag })
}

// benchApply runs the apply benchmark on 1, 5 and 10 machines whose agents
// have ctr as their container driver (nil: none); withWork makes the
// service a process or an image.
func benchApply(b *testing.B, ctr *runtime.Container, withWork func(*store.ServiceSpec)) {
	for _, n := range []int{1, 5, 10} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			srv := storetest.Start(b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stopRepublish, err := routing.ServeRepublish(ctx, srv.Store)
			if err != nil {
				b.Fatal(err)
			}
			defer stopRepublish()
			// As a control server of this release leaves it: the agents
			// write instance states to their observations only.
			if _, err := srv.Store.RaiseFloor(ctx, store.GenerationObserved, "bench"); err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{}, n)
			for i := 0; i < n; i++ {
				id := fmt.Sprintf("m%02d", i)
				rec := store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive, Address: "127.0.0.1"}
				if err := srv.Store.PutMachine(ctx, &rec); err != nil {
					b.Fatal(err)
				}
				a, err := agent.New(agent.Config{Store: srv.Connect(b), Machine: rec, DataDir: b.TempDir(),
					Driver: &runtime.Process{}, Containers: ctr, StopGrace: time.Second, Logger: zap.NewNop()})
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = a.Run(ctx); done <- struct{}{} }()
			}
			var candidates, drain time.Duration
			d := New(srv.Store, Options{DrainGrace: time.Millisecond, GatewayWait: time.Millisecond, StopGrace: time.Second,
				OnStep: func(step Step, took time.Duration) {
					switch step {
					case StepStartCandidates:
						candidates += took
					case StepDrainOld:
						drain += took
					}
				}})
			// Wait until every agent answers.
			storetest.Eventually(b, 10*time.Second, "agents", func() bool {
				for i := 0; i < n; i++ {
					if srv.Store.Call(ctx, fmt.Sprintf("m%02d", i), store.CmdCapacity, nil, nil) != nil {
						return false
					}
				}
				return true
			})
			replicas := n
			manifest := func(v int) *store.Manifest {
				spec := store.ServiceSpec{
					Replicas: &replicas, Env: map[string]string{"V": fmt.Sprint(v)},
					Readiness: store.Readiness{Path: "/healthz"},
					Routes:    []store.Route{{Hosts: []string{"bench.example.com"}}},
				}
				withWork(&spec)
				return &store.Manifest{Namespace: "bench", Services: map[string]store.ServiceSpec{"web": spec}}
			}
			if _, err := d.Apply(ctx, manifest(-1)); err != nil {
				b.Fatal(err)
			}
			candidates, drain = 0, 0
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := d.Apply(ctx, manifest(i)); err != nil {
					b.Fatal(err)
				}
			}
			total := time.Since(start)
			b.StopTimer()
			per := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(per(total-candidates-drain), "overhead-ms/op")
			b.ReportMetric(per(candidates), "candidates-ms/op")
			b.ReportMetric(per(drain), "drain-ms/op")
			// Stop the last instances.
			insts, _ := srv.Store.NamespaceInstances(ctx, "bench")
			for _, in := range insts {
				_ = srv.Store.Call(ctx, in.Machine, store.CmdStopInstance, store.InstanceRequest{InstanceID: in.ID, Namespace: "bench", Forget: true}, nil)
			}
			cancel()
			for i := 0; i < n; i++ {
				<-done
			}
		})
	}
}

func buildHello(b *testing.B) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), "hello")
	if msg, err := exec.Command("go", "build", "-o", out, "../../examples/hello").CombinedOutput(); err != nil {
		b.Fatalf("building hello: %v\n%s", err, msg)
	}
	_ = os.Chmod(out, 0o755)
	return out
}
