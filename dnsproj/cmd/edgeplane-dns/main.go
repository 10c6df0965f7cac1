// Command edgeplane-dns serves the edgeplane cluster zone without the
// gateway: it builds its own routing projection from NATS (serving the last
// good snapshot while NATS is unreachable) and answers DNS over UDP and TCP.
//
//	edgeplane-dns --nats nats://10.100.0.1:4222 --listen 127.0.0.1:1053 \
//	    --region fra --forward 1.1.1.1,9.9.9.9 --snapshot /var/lib/edgeplane/dns-routing.json
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/dnsproj"
	"github.com/edgeplane/edgeplane/internal/logging"
	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], nil)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and returns the process's exit status: 0
// for success and for --help, 1 for any failure.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "edgeplane-dns:", err)
	return 1
}

type options struct {
	store                           store.Config
	listen, zone, forward, snapshot string
	region                          string
	nsAddrs, metrics, logLevel      string
	ttl                             time.Duration
	maxUDP                          int
	noCache                         bool
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("edgeplane-dns", flag.ContinueOnError)
	o.store.AddFlags(fs)
	fs.StringVar(&o.listen, "listen", dnsproj.DefaultListen, "address to serve DNS on, UDP and TCP")
	fs.StringVar(&o.zone, "zone", dnsproj.DefaultZone, "cluster zone answered from the projection")
	fs.StringVar(&o.region, "region", "", "this server's region: services are answered with its instances first (default: none, every active region alike)")
	fs.DurationVar(&o.ttl, "ttl", dnsproj.DefaultTTL, "TTL of zone records")
	fs.StringVar(&o.forward, "forward", "", "comma-separated upstream resolvers (IP[:port]) for other names; none: REFUSED")
	fs.BoolVar(&o.noCache, "no-cache", false, "do not cache forwarded answers")
	fs.StringVar(&o.snapshot, "snapshot", "", "file keeping the last good routing view, served at start while NATS is down")
	fs.StringVar(&o.nsAddrs, "ns-address", "", "comma-separated addresses published for ns.<zone> (default: the listen IP)")
	fs.IntVar(&o.maxUDP, "max-udp-size", dnsproj.DefaultMaxUDPSize, "largest UDP reply; larger ones are truncated")
	fs.StringVar(&o.metrics, "metrics", "", "address to serve Prometheus /metrics on (default: off)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

func (o *options) dnsConfig() (dnsproj.Config, error) {
	cfg := dnsproj.Config{Zone: o.zone, Region: o.region, TTL: o.ttl, MaxUDPSize: o.maxUDP}
	cfg.Forward.Upstreams = splitList(o.forward)
	cfg.Cache.Disabled = o.noCache
	var hosts []string
	if host, _, err := splitHostPort(o.listen); err == nil {
		hosts = []string{host}
	}
	var err error
	if cfg.NSAddrs, err = dnsproj.NSAddrs(splitList(o.nsAddrs), hosts); err != nil {
		return cfg, fmt.Errorf("--ns-address %w", err)
	}
	if o.region != "" {
		if err := dnsproj.ValidRegion(o.region); err != nil {
			return cfg, fmt.Errorf("--region: %w", err)
		}
	}
	return cfg, cfg.Validate()
}

// run serves until ctx ends; it sends the bound DNS address on started
// (if not nil) once serving.
func run(ctx context.Context, args []string, started chan<- string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log, err := logging.New(os.Stderr, o.logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	defer log.Sync() //nolint:errcheck

	cfg, err := o.dnsConfig()
	if err != nil {
		return err
	}
	if _, err := o.store.Resolve(); err != nil {
		return err
	}
	if o.snapshot != "" {
		// A trust root learned on first contact is pinned beside the
		// snapshot.
		o.store.TrustPinFile = o.snapshot + ".trust-root"
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	cfg.Logger = log

	p, err := projection.New(projection.Config{
		SnapshotPath: o.snapshot,
		Logger:       log.Named("projection"),
		Connect: func(ctx context.Context) (*store.Store, error) {
			return o.store.DialFollowing(ctx, store.ConnectOptions{Name: "edgeplane-dns", ReconnectForever: true},
				func(err error) { log.Warn("following the fleet's CA bundle", zap.Error(err)) })
		},
	})
	if err != nil {
		return err
	}
	// The projection's own figures (edgeplane_projection_*, refused
	// events among them), as the gateway shows them.
	if err := projection.RegisterMetrics(reg, p); err != nil {
		return err
	}
	srv, err := dnsproj.New(cfg, dnsproj.ProjectionSource(p))
	if err != nil {
		return err
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = p.Run(ctx)
	}()

	addr, err := srv.ListenAndServe(o.listen)
	if err != nil {
		stop()
		return err
	}
	log.Info("serving dns", zap.String("listen", addr), zap.String("zone", srv.Zone()), zap.String("region", cfg.Region),
		zap.Strings("forward", cfg.Forward.Upstreams), zap.String("nats", o.store.NATSURL))
	if started != nil {
		started <- addr
	}

	var metricsSrv *http.Server
	if o.metrics != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Addr: o.metrics, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := metricsSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", zap.Error(err))
			}
		}()
	}

	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if metricsSrv != nil {
		_ = metricsSrv.Shutdown(sctx)
	}
	return srv.Close(sctx)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func splitHostPort(s string) (string, string, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", errors.New("no port")
	}
	return strings.Trim(s[:i], "[]"), s[i+1:], nil
}
