// Command seed is the bench's control plane: it starts an embedded NATS
// server with JetStream, deploys synthetic services into it the way
// `control deploy apply` does, writes the same records as a hosts file and
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

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/projection/projectiontest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "working directory (NATS data and the generated files)")
	listen := flag.String("listen", "127.0.0.1:0", "NATS client address")
	services := flag.Int("services", 100, "services to deploy (namespace \"bench\")")
	instances := flag.Int("instances", 3, "routable instances per service")
	zone := flag.String("zone", "edgeplane.internal.", "cluster zone")
	nxPercent := flag.Int("nx-percent", 10, "share of queries for missing names (NXDOMAIN)")
	flag.Parse()
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	z := strings.TrimSuffix(strings.ToLower(*zone), ".") + "."

	ns, err := storagenode.Start(storagenode.Config{DataDir: filepath.Join(*dir, "nats"), Listen: *listen})
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names, _ := store.NewNames("", "")
	st, err := store.Provision(ctx, nc, names, store.Layout{})
	if err != nil {
		return err
	}

	var hosts, queries strings.Builder
	svcs := map[string]projectiontest.Service{}
	for i := 0; i < *services; i++ {
		name := fmt.Sprintf("svc%d", i)
		var insts []projectiontest.Instance
		for j := 0; j < *instances; j++ {
			addr := fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1)
			insts = append(insts, projectiontest.Instance{ID: fmt.Sprintf("%s-i%d", name, j), Machine: "m1", Address: addr, Port: 8080})
			fmt.Fprintf(&hosts, "%s %s.bench.%s\n", addr, name, z)
		}
		svcs[name] = projectiontest.Service{Instances: insts}
	}
	if _, _, err := projectiontest.Deploy(ctx, st, "bench", svcs); err != nil {
		return err
	}
	// The query mix: A lookups of services, and nx-percent of missing names.
	for i := 0; i < 1000; i++ {
		if i%100 < *nxPercent {
			fmt.Fprintf(&queries, "missing%d.bench.%s A\n", i, z)
		} else {
			fmt.Fprintf(&queries, "svc%d.bench.%s A\n", i%*services, z)
		}
	}
	zoneFile := fmt.Sprintf("$ORIGIN %s\n@ 5 IN SOA ns.%s hostmaster.%s 1 60 30 3600 5\n@ 5 IN NS ns.%s\nns 5 IN A 127.0.0.1\n", z, z, z, z)
	for name, body := range map[string]string{"hosts": hosts.String(), "queries.txt": queries.String(), "zone.db": zoneFile} {
		if err := os.WriteFile(filepath.Join(*dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	// Announce readiness last: the script waits for this file.
	if err := os.WriteFile(filepath.Join(*dir, "nats.url"), []byte(ns.ClientURL()+"\n"), 0o644); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	return nil
}
