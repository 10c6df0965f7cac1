package powercut_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/internal/powercut"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startJetStream starts a JetStream server storing in dir.
func startJetStream(t *testing.T, dir string, syncAlways bool) (*server.Server, jetstream.JetStream, *nats.Conn) {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, SyncAlways: syncAlways, NoLog: true, NoSigs: true}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return s, js, nc
}

// JetStream on the simulator: what it acknowledged before a cut, with its
// default sync (every two minutes) and with SyncAlways. The simulator
// must carry a real JetStream store through a cut and a restart; the
// figures say what a power cut costs under each.
func TestJetStreamAcknowledgedThroughACut(t *testing.T) {
	for _, syncAlways := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync_always=%v", syncAlways), func(t *testing.T) {
			f, mnt, backing := mounted(t)
			store := filepath.Join(mnt, "js")
			if err := os.Mkdir(store, 0o755); err != nil {
				t.Fatal(err)
			}
			s, js, nc := startJetStream(t, store, syncAlways)
			ctx := context.Background()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "COMMITS", Subjects: []string{"commits.>"}}); err != nil {
				t.Fatal(err)
			}
			const n = 200
			for i := range n {
				if _, err := js.Publish(ctx, fmt.Sprintf("commits.%d", i), []byte("commit")); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Cut(); err != nil {
				t.Fatal(err)
			}
			nc.Close()
			s.Shutdown()
			s.WaitForShutdown()
			<-f.Done()
			again, err := powercut.Mount(backing, mnt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { again.Unmount() })
			s2, js2, nc2 := startJetStream(t, store, syncAlways)
			defer func() { nc2.Close(); s2.Shutdown(); s2.WaitForShutdown() }()
			var kept uint64
			st, err := js2.Stream(ctx, "COMMITS")
			if err != nil {
				t.Logf("sync_always=%v: the stream itself is gone after the cut: %v", syncAlways, err)
			} else {
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				kept = info.State.Msgs
			}
			t.Logf("sync_always=%v: %d of %d acknowledged messages after the cut", syncAlways, kept, n)
			if syncAlways && kept != n {
				t.Errorf("with SyncAlways, %d of %d acknowledged messages survived the cut", kept, n)
			}
		})
	}
}
