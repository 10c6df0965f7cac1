package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
)

// applyResult is one `control deploy apply` of the loop.
type applyResult struct {
	n        int
	deployID string
	state    string
	code     int
	err      store.Error
	took     time.Duration
	start    time.Time
}

// TestAppliesRideThroughStorageNodeKill is a three-node storage cluster,
// each node in a network namespace of its own, and an operator applying in
// a loop (the CLI connects to all three nodes) while the node that leads
// the commits stream is killed (SIGKILL) and restarted, twice. Every apply
// either succeeds or fails with a clear error before its final commit (its
// deploy ID is not in the commits stream); at least 95% succeed; and the
// commits stream is identical on all three nodes afterwards.
func TestAppliesRideThroughStorageNodeKill(t *testing.T) {
	sc := newStorageCluster(t)
	ctx := context.Background()
	sc.startAgent("m1", 1, 2, 3)
	all := sc.url(1) + "," + sc.url(2) + "," + sc.url(3)

	applies := 100
	if testing.Short() {
		applies = 30
	}
	apply := func(n int) applyResult {
		r := applyResult{n: n, start: time.Now()}
		out, errOut, code := runControl(t, []string{"EDGEPLANE_NATS=" + all, "EDGEPLANE_NATS_CREDS=" + sc.creds,
			"EDGEPLANE_SIGNING_KEY=" + filepath.Join(sc.dir, "s1", signers.SignerFile)},
			"deploy", "apply", "-f", writeManifest(t, sc.dir, fmt.Sprint(n)), "-o", "json",
			"--drain-grace", "10ms", "--gateway-wait", "1s", "--stop-grace", "2s")
		r.took, r.code = time.Since(r.start), code
		var st store.DeployStatus
		if json.Unmarshal([]byte(out), &st) == nil {
			r.deployID, r.state = st.DeployID, string(st.State)
		}
		if code != 0 {
			var e struct{ Error store.Error }
			if json.Unmarshal([]byte(errOut), &e) != nil || e.Error.Code == "" {
				t.Errorf("apply %d failed without a structured error: exit %d\n%s\n%s", n, code, out, errOut)
			}
			r.err = e.Error
		}
		return r
	}

	// The killer: twice, once the loop is a fifth and then three fifths
	// in, the node leading the commits stream is killed mid-apply and
	// restarted 10 s later from its data dir.
	var mu sync.Mutex
	done := 0
	var kills []string
	killerDone := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(killerDone)
		s := sc.open(1, sc.creds)
		for _, at := range []int{applies / 5, applies * 3 / 5} {
			for {
				mu.Lock()
				d := done
				mu.Unlock()
				if d >= at {
					break
				}
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			time.Sleep(300 * time.Millisecond) // into the next apply
			leader := ""
			for leader == "" {
				ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
				// Bound here, not by storetest.Stream: no t.Fatal off
				// the test's goroutine, and a node down is retried.
				var info *jetstream.StreamInfo
				commits, err := s.JS.Stream(ictx, s.Names.DeployCommitsStream())
				if err == nil {
					info, err = commits.Info(ictx)
				}
				cancel()
				if err == nil && info.Cluster != nil {
					leader = info.Cluster.Leader
				}
			}
			i := int(leader[1] - '0')
			sc.servers[i-1].stop(syscall.SIGKILL)
			mu.Lock()
			kills = append(kills, fmt.Sprintf("%s killed at %s", leader, time.Now().Format("15:04:05.000")))
			mu.Unlock()
			time.Sleep(10 * time.Second) // the node stays down
			sc.servers[i-1] = sc.startNode(i, fmt.Sprintf(" (restart %d)", len(kills)))
			sc.servers[i-1].waitOutput(t, `control server ready`, 90*time.Second)
		}
	}()
	var results []applyResult
	for n := 1; n <= applies; n++ {
		r := apply(n)
		results = append(results, r)
		mu.Lock()
		done++
		mu.Unlock()
	}
	close(stop)
	<-killerDone

	s := sc.open(1, sc.creds)
	var commits []string
	eventually(t, 60*time.Second, "the commits to be readable", func() bool {
		var err error
		commits, err = readFinalCommitIDs(s)
		return err == nil
	})
	failed := 0
	var slow []string
	for _, r := range results {
		committed := r.deployID != "" && slices.Contains(commits, r.deployID)
		if r.code == 0 {
			if !committed {
				t.Errorf("apply %d (deploy %s) succeeded but its final commit is missing", r.n, r.deployID)
			}
		} else {
			failed++
			t.Logf("apply %d failed after %s: %s: %s", r.n, r.took.Round(time.Millisecond), r.err.Code, r.err.Message)
			if committed {
				t.Errorf("apply %d (deploy %s) failed after its final commit: %s", r.n, r.deployID, r.err.Message)
			}
		}
		if r.took > 5*time.Second {
			slow = append(slow, fmt.Sprintf("#%d %s", r.n, r.took.Round(100*time.Millisecond)))
		}
	}
	var answers []store.StorageNodeStatus
	eventually(t, 60*time.Second, "all three replicas of the commits to agree", func() bool {
		var err error
		answers, err = store.GatherStorageStatus(ctx, s.NC, sc.names, 2*time.Second)
		return err == nil && len(answers) == 3 && replicasAgree(answers, sc.names.DeployCommitsStream())
	})
	t.Logf("%d applies, %d failed (%.0f%% succeeded); %v; slow applies: %v", applies, failed,
		100*float64(applies-failed)/float64(applies), kills, slow)
	if ok := applies - failed; ok*100 < applies*95 {
		t.Errorf("%d of %d applies succeeded, want at least 95%%", ok, applies)
	}
}
