package certs_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

// gatewayMain is one gateway of the end-to-end test: a certmagic.Config on
// our storage with an ACME issuer (behind the fleet budget) pointed at
// Pebble, HTTP-01 answered by certmagic's HTTPChallengeHandler on its own
// loopback port, TLS served from the certificate cache, and a Renewer
// taking renewal work. Commands on stdin: "manage <host>".
func gatewayMain() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := os.Getenv("EP_NAME")
	fail := func(err error) int {
		fmt.Println("ERR", err)
		return 1
	}
	logger, _ := zap.NewDevelopment()
	logger = logger.Named(name)
	st, err := helperStore(ctx)
	if err != nil {
		return fail(err)
	}
	ttl, _ := time.ParseDuration(os.Getenv("EP_LOCK_TTL"))
	storage, err := certs.New(store.Bound(st), certs.Options{LockTTL: ttl, Holder: name, Logger: logger})
	if err != nil {
		return fail(err)
	}
	rootPEM, err := os.ReadFile(os.Getenv("EP_CA_ROOT"))
	if err != nil {
		return fail(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(rootPEM)

	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	httpPort := httpLn.Addr().(*net.TCPAddr).Port

	var cfg *certmagic.Config
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return cfg, nil },
		Logger:           logger,
	})
	defer cache.Stop()
	cfg = certmagic.New(cache, certmagic.Config{
		Storage: storage,
		Logger:  logger,
		// Normalise subjects before certmagic names locks and keys.
		SubjectTransformer: func(_ context.Context, n string) string {
			if h, err := certs.NormalizeHost(n); err == nil {
				return h
			}
			return n
		},
	})
	acme := certmagic.NewACMEIssuer(cfg, certmagic.ACMEIssuer{
		CA: os.Getenv("EP_CA"), TestCA: os.Getenv("EP_CA"),
		Email: "ops@example.com", Agreed: true,
		TrustedRoots: roots,
		ListenHost:   "127.0.0.1", AltHTTPPort: httpPort,
		DisableTLSALPNChallenge: true,
		Logger:                  logger,
	})
	limit, _ := strconv.Atoi(os.Getenv("EP_BUDGET"))
	budget, err := certs.NewBudget(store.Bound(st), certs.BudgetOptions{Limit: limit})
	if err != nil {
		return fail(err)
	}
	cfg.Issuers = []certmagic.Issuer{certs.BudgetIssuer{Issuer: acme, Budget: budget}}
	backoff, _ := time.ParseDuration(os.Getenv("EP_BACKOFF"))
	renewer, err := certs.NewRenewer(certs.RenewerConfig{
		Link: store.Bound(st), Renew: certs.CertmagicRenew(cfg), Name: name, Logger: logger,
		Backoff: func(int) time.Duration { return backoff },
		AckWait: 30 * time.Second,
	})
	if err != nil {
		return fail(err)
	}
	cfg.OnEvent = func(ctx context.Context, event string, data map[string]any) error {
		if err := renewer.HandleEvent(ctx, storage, event, data); err != nil {
			logger.Error("recording certificate", zap.Error(err))
		}
		return nil
	}

	go func() {
		_ = http.Serve(httpLn, acme.HTTPChallengeHandler(http.NotFoundHandler()))
	}()
	tlsCfg := cfg.TLSConfig()
	tlsCfg.NextProtos = []string{"http/1.1"}
	tlsLn, err := tls.Listen("tcp", "127.0.0.1:0", tlsCfg)
	if err != nil {
		return fail(err)
	}
	go func() {
		_ = http.Serve(tlsLn, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, name) }))
	}()
	go func() {
		if err := renewer.Run(ctx); err != nil {
			logger.Error("renewer stopped", zap.Error(err))
		}
	}()
	fmt.Printf("READY http=%s tls=%s\n", httpLn.Addr(), tlsLn.Addr())

	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "manage" {
			fmt.Println("ERR unknown command", sc.Text())
			continue
		}
		host := f[1]
		go func() {
			if err := cfg.ManageSync(ctx, []string{host}); err != nil {
				fmt.Println("ERR manage", host, strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			fmt.Println("OK manage", host)
		}()
	}
	return 0
}
