package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

func cmdServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("control server", stderr)
	data := fs.String("data", "", "data dir: the JetStream store and, with --agent, the local agent (required)")
	listen := fs.String("listen", store.DefaultListen, "client address of the embedded NATS server")
	external := fs.String("nats", "", "use this external NATS (cluster) URL instead of the embedded server")
	creds := fs.String("creds", "", "credentials file for --nats")
	inst := fs.String("installation", store.DefaultInstallation, "installation scope of every name")
	auth := fs.String("authority", store.DefaultAuthority, "authority scope of every name")
	withAgent := fs.Bool("agent", false, "also run this box's agent, recording it as a machine")
	machine := fs.String("machine", "", "with --agent: machine ID (default: the hostname)")
	advertise := fs.String("advertise", "127.0.0.1", "with --agent: IP instances listen on and are reached at")
	natsLogs := fs.Bool("nats-logs", false, "print the embedded NATS server's logs")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *data == "" {
		return usagef("--data is required")
	}
	names, err := store.NewNames(*inst, *auth)
	if err != nil {
		return usagef("%v", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))

	url := *external
	if url == "" {
		ns, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: *data, Listen: *listen, Logs: *natsLogs})
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		url = ns.ClientURL()
		fmt.Fprintf(stdout, "embedded NATS with JetStream on %s (store %s)\n", url, filepath.Join(*data, "jetstream"))
	}
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: *creds, Name: "control server", ReconnectForever: true})
	if err != nil {
		return err
	}
	defer nc.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := store.Provision(pctx, nc, names, store.Layout{})
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "provisioned streams and buckets for installation %s, authority %s\n", names.Installation, names.Authority)

	var wg sync.WaitGroup
	// Explicit completion of deploys whose orchestrator stopped after the
	// final commit: their routing events must still go out. A crashed
	// holder's lease may take its TTL to expire, so this runs beside serving.
	wg.Add(1)
	go func() {
		defer wg.Done()
		d := deploy.New(s, deploy.Options{Out: stdout})
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := d.CompleteAll(cctx); err != nil && ctx.Err() == nil {
			fmt.Fprintf(stderr, "warning: completing interrupted deploys: %v\n", err)
		}
	}()
	errc := make(chan error, 1)
	if *withAgent {
		id := *machine
		if id == "" {
			if id, err = os.Hostname(); err != nil {
				return fmt.Errorf("machine id: %w", err)
			}
		}
		rec, err := machines.Register(ctx, s, id, *advertise)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "local agent for machine %s (%s)\n", rec.ID, rec.Address)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runAgent(ctx, s, rec, filepath.Join(*data, "agent"), 256, 10*time.Second, logger); err != nil {
				errc <- err
			}
		}()
	}
	fmt.Fprintln(stdout, "control server ready")
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	wg.Wait()
	fmt.Fprintln(stdout, "control server stopping (instances keep running)")
	return err
}
