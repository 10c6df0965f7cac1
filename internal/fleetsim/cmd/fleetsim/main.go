// Command fleetsim runs a simulated fleet against a running control plane:
// N machines whose agents answer the real RPCs, write real records,
// heartbeats and machine state, and run nothing, until Ctrl-C. With it,
// `control machine ls`, `control status` and `control deploy apply` can be
// tried at fleet size on one box. It writes machine records directly, so it
// needs control credentials (or none, on a loopback box).
//
//	go run ./internal/fleetsim/cmd/fleetsim --machines 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/internal/fleetsim"
	"github.com/edgeplane/edgeplane/store"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	var cfg store.Config
	cfg.AddFlags(fs)
	n := fs.Int("machines", 100, "how many machines to simulate")
	prefix := fs.String("prefix", "sim", "machine IDs are PREFIX plus a five-digit number")
	capacity := fs.Int("capacity", 256, "instances each machine accepts")
	beat := fs.Duration("heartbeat", store.DefaultBeatInterval, "heartbeat interval of every simulated agent")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *n <= 0 {
		fmt.Fprintln(os.Stderr, "fleetsim: --machines must be positive")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := cfg.DialForWrites(dctx, store.ConnectOptions{Name: "fleetsim", ReconnectForever: true})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	defer s.NC.Close()
	start := time.Now()
	f, err := fleetsim.Start(ctx, s, fleetsim.Config{Machines: *n, Prefix: *prefix, Capacity: *capacity, Beat: *beat})
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	defer f.Stop()
	fmt.Printf("%d simulated machines (%s00000..) answering, beating every %s; started in %s; Ctrl-C stops them\n",
		*n, *prefix, *beat, time.Since(start).Round(time.Millisecond))
	<-ctx.Done()
	fmt.Printf("stopping; %d simulated instances were running\n", f.Instances())
	return 0
}
