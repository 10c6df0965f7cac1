// Command seed is the bench's control plane: it starts an embedded NATS
// server with JetStream, deploys synthetic services into it the way
// `control deploy apply` does (signed under a trust root of its own, as
// control server signs them), writes the same records as a hosts file and
// a zone file for CoreDNS plus a dnsperf query file, and serves NATS until
// it is stopped.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// config is the seed's command line.
type config struct {
	dir, listen, zone              string
	services, instances, nxPercent int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dir, "dir", "", "working directory (NATS data and the generated files)")
	flag.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "NATS client address")
	flag.IntVar(&cfg.services, "services", 100, "services to deploy (namespace \"bench\")")
	flag.IntVar(&cfg.instances, "instances", 3, "routable instances per service")
	flag.StringVar(&cfg.zone, "zone", "edgeplane.internal.", "cluster zone")
	flag.IntVar(&cfg.nxPercent, "nx-percent", 10, "share of queries for missing names (NXDOMAIN)")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	ns, err := seed(ctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	// Announce readiness last: the script waits for this file.
	if err := os.WriteFile(filepath.Join(cfg.dir, "nats.url"), []byte(ns.ClientURL()+"\n"), 0o644); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	return nil
}

// seed starts the store, deploys cfg's services into it and writes the
// bench's files; the caller shuts the server down.
func seed(ctx context.Context, cfg config) (_ *server.Server, err error) {
	if cfg.dir == "" {
		return nil, fmt.Errorf("--dir is required")
	}
	z := strings.TrimSuffix(strings.ToLower(cfg.zone), ".") + "."

	ns, err := storagenode.Start(storagenode.Config{DataDir: filepath.Join(cfg.dir, "nats"), Listen: cfg.listen})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ns.Shutdown()
		}
	}()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	names, _ := store.NewNames("", "")
	st, err := store.Provision(ctx, nc, names, store.Layout{})
	if err != nil {
		return nil, err
	}
	// Routing is intent: unsigned events are refused by every projection.
	// The trust root lives in DIR/auth and is published to the store,
	// where edgeplane-dns learns it on first contact.
	if _, err := signers.Server(ctx, st, filepath.Join(cfg.dir, "auth"), cfg.dir, "dns bench seed"); err != nil {
		return nil, fmt.Errorf("signing keys: %w", err)
	}

	var hosts, queries strings.Builder
	svcs := map[string]storetest.Service{}
	for i := 0; i < cfg.services; i++ {
		name := fmt.Sprintf("svc%d", i)
		var insts []storetest.Instance
		for j := 0; j < cfg.instances; j++ {
			addr := fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1)
			// A machine per address: an endpoint is reached at its
			// machine's admitted address.
			insts = append(insts, storetest.Instance{ID: fmt.Sprintf("%s-i%d", name, j), Machine: fmt.Sprintf("m%d-%d", i, j), Address: addr, Port: 8080})
			fmt.Fprintf(&hosts, "%s %s.bench.%s\n", addr, name, z)
		}
		svcs[name] = storetest.Service{Instances: insts}
	}
	if _, _, err := storetest.Deploy(ctx, st, "bench", svcs); err != nil {
		return nil, err
	}
	// The query mix: A lookups of services, and nx-percent of missing names.
	for i := 0; i < 1000; i++ {
		if i%100 < cfg.nxPercent {
			fmt.Fprintf(&queries, "missing%d.bench.%s A\n", i, z)
		} else {
			fmt.Fprintf(&queries, "svc%d.bench.%s A\n", i%cfg.services, z)
		}
	}
	zoneFile := fmt.Sprintf("$ORIGIN %s\n@ 5 IN SOA ns.%s hostmaster.%s 1 60 30 3600 5\n@ 5 IN NS ns.%s\nns 5 IN A 127.0.0.1\n", z, z, z, z)
	for name, body := range map[string]string{"hosts": hosts.String(), "queries.txt": queries.String(), "zone.db": zoneFile} {
		if err := os.WriteFile(filepath.Join(cfg.dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	return ns, nil
}
