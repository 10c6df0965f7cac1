package metricsserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The registry is served on /metrics until stop, after which the address
// is free again.
func TestServesTheRegistryUntilStopped(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeplane_test_gauge", Help: "a test gauge"}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop, err := Serve(context.Background(), addr, reg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "edgeplane_test_gauge 0") {
		t.Fatalf("metrics:\n%s", b)
	}
	stop()
	if l, err := net.Listen("tcp", addr); err != nil {
		t.Fatalf("the address is still taken after stop: %v", err)
	} else {
		l.Close()
	}
}

func TestRefusesABadAddress(t *testing.T) {
	if _, err := Serve(context.Background(), "256.0.0.1:1", prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "metrics on 256.0.0.1:1") {
		t.Fatalf("a bad address: %v", err)
	}
}
