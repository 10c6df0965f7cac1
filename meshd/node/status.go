package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeplane/edgeplane/store"
)

// serveSocket answers `meshd status` and `meshd leave` on a unix socket in
// the data dir: GET /status, POST /shutdown.
func (n *Node) serveSocket(ctx context.Context) (func(), error) {
	path := filepath.Join(n.cfg.DataDir, SocketName)
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("another meshd is running on data dir %s (socket %s answers)", n.cfg.DataDir, path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	_ = os.Chmod(path, 0o600)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		s, err := n.Status()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("POST /shutdown", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		n.log.Info("shutdown requested over the status socket")
		n.Shutdown()
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = os.Remove(path)
	}, nil
}

func socketClient(dataDir string) *http.Client {
	path := filepath.Join(dataDir, SocketName)
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}
}

// ErrNotRunning means no meshd answers on the data dir's socket.
var ErrNotRunning = errors.New("meshd is not running on this data dir")

// QueryStatus asks the meshd running on dataDir for its status.
func QueryStatus(ctx context.Context, dataDir string) (*Status, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://meshd/status", nil)
	resp, err := socketClient(dataDir).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNotRunning, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status: %s", resp.Status)
	}
	var s Status
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, fmt.Errorf("decoding status: %w", err)
	}
	return &s, nil
}

// RequestShutdown asks the meshd running on dataDir to tear down and exit,
// and waits until its socket is gone. It returns ErrNotRunning if none runs.
func RequestShutdown(ctx context.Context, dataDir string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://meshd/shutdown", nil)
	resp, err := socketClient(dataDir).Do(req)
	if err != nil {
		return ErrNotRunning
	}
	resp.Body.Close()
	path := filepath.Join(dataDir, SocketName)
	for {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for meshd to stop: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// metrics are the node's Prometheus metrics, on their own registry.
type metrics struct {
	reg             *prometheus.Registry
	heartbeats      *prometheus.CounterVec
	reconciles      prometheus.Counter
	reconcileErrors prometheus.Counter
	corrections     *prometheus.CounterVec
	peers           *prometheus.GaugeVec
	watchRestarts   prometheus.Counter
	polls           prometheus.Counter
	refused         *prometheus.CounterVec
	rotations       prometheus.Counter
	rotateErrors    prometheus.Counter
	directProbes    *prometheus.CounterVec
	relayLost       prometheus.Counter
}

func newMetrics(n *Node) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshd_heartbeats_total",
			Help: "Heartbeats written, by result."}, []string{"result"}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_reconciles_total",
			Help: "Peer reconciles run (watch-triggered and periodic)."}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_reconcile_errors_total",
			Help: "Reconciles that failed to apply."}),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshd_peer_corrections_total",
			Help: "Peer changes applied to the device, by kind."}, []string{"kind"}),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshd_peers",
			Help: "Peers by state: active (in the device) or dropped (offline)."}, []string{"state"}),
		watchRestarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_watch_restarts_total",
			Help: "Times the mesh-peers watch broke and was restarted."}),
		polls: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_full_state_polls_total",
			Help: "Full-state polls made while the watch was down past the fallback."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshd_peer_records_refused_total",
			Help: "Peer records not applied because their signature did not verify (the peer's last good record stays), by reason."}, []string{"reason"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_key_rotations_total",
			Help: "Times this node switched its device to a new key."}),
		rotateErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_key_rotation_errors_total",
			Help: "Key rotation steps that failed (retried every reconcile interval)."}),
		directProbes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshd_direct_probes_total",
			Help: "Probes of relayed peers' direct paths: sent, and answered (the tunnel moved back)."}, []string{"result"}),
		relayLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_relay_allocations_lost_total",
			Help: "Relay allocations that stopped answering their probe and were replaced."}),
	}
	m.reg.MustRegister(m.heartbeats, m.reconciles, m.reconcileErrors, m.corrections, m.peers, m.watchRestarts, m.polls, m.refused,
		m.rotations, m.rotateErrors, m.directProbes, m.relayLost, &peerCollector{n: n}, prometheus.NewGoCollector())
	return m
}

func (m *metrics) observeReconcile(p *plan, active, dropped int) {
	m.reconciles.Inc()
	m.corrections.WithLabelValues("added").Add(float64(len(p.added)))
	m.corrections.WithLabelValues("removed").Add(float64(len(p.removed)))
	m.corrections.WithLabelValues("updated").Add(float64(len(p.updated)))
	m.corrections.WithLabelValues("endpoint").Add(float64(p.endpointsChanged))
	m.peers.WithLabelValues("active").Set(float64(active))
	m.peers.WithLabelValues("dropped").Set(float64(dropped))
}

func (m *metrics) serve(addr string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// peerCollector reports per-peer handshake age and traffic at scrape time.
type peerCollector struct{ n *Node }

var (
	descHandshake = prometheus.NewDesc("meshd_peer_handshake_age_seconds", "Seconds since the last handshake with a peer.", []string{"peer"}, nil)
	descRx        = prometheus.NewDesc("meshd_peer_rx_bytes", "Bytes received from a peer.", []string{"peer"}, nil)
	descTx        = prometheus.NewDesc("meshd_peer_tx_bytes", "Bytes sent to a peer.", []string{"peer"}, nil)
	descSTUN      = prometheus.NewDesc("meshd_stun_packets_total", "STUN packets demultiplexed off the WireGuard socket.", nil, nil)
	descRelayed   = prometheus.NewDesc("meshd_peer_relayed", "1 when the device reaches a peer through the mesh relay, 0 when directly.", []string{"peer"}, nil)
	descPathAge   = prometheus.NewDesc("meshd_peer_path_age_seconds", "Seconds since the device's path to a peer last changed (or was first seen).", []string{"peer"}, nil)
)

func (c *peerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHandshake
	ch <- descRx
	ch <- descTx
	ch <- descSTUN
	ch <- descRelayed
	ch <- descPathAge
}

func (c *peerCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.n.Status()
	if err != nil {
		return
	}
	for _, p := range s.Peers {
		if !p.Active || p.Key == KeyPrevious {
			continue
		}
		if !p.LastHandshake.IsZero() {
			ch <- prometheus.MustNewConstMetric(descHandshake, prometheus.GaugeValue, p.HandshakeAgeSec, p.Machine)
		}
		ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(p.RxBytes), p.Machine)
		ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(p.TxBytes), p.Machine)
		relayed := 0.0
		if p.Path == PathRelayed {
			relayed = 1
		}
		ch <- prometheus.MustNewConstMetric(descRelayed, prometheus.GaugeValue, relayed, p.Machine)
		if !p.PathSince.IsZero() {
			ch <- prometheus.MustNewConstMetric(descPathAge, prometheus.GaugeValue, time.Since(p.PathSince).Seconds(), p.Machine)
		}
	}
	ch <- prometheus.MustNewConstMetric(descSTUN, prometheus.CounterValue, float64(c.n.dev.demux.STUNPackets.Load()))
}

// Status is what `meshd status` shows.
type Status struct {
	Machine    string                 `json:"machine"`
	MeshIP     string                 `json:"mesh_ip"`
	PublicKey  string                 `json:"public_key"`
	Mode       string                 `json:"mode"`
	Interface  string                 `json:"interface"`
	ListenPort int                    `json:"listen_port"`
	Member     bool                   `json:"member"`
	Control    ControlInfo            `json:"control"`
	NAT        natResult              `json:"nat"`
	Drift      *store.MeshDriftReport `json:"drift,omitempty"`
	Relay      RelayStatus            `json:"relay"`
	Peers      []PeerStatus           `json:"peers"`
}

// ControlInfo describes the link to the control plane.
type ControlInfo struct {
	URL       string    `json:"url"`
	Connected bool      `json:"connected"`
	Watch     string    `json:"watch"` // live, down or polling
	Source    string    `json:"source"`
	LastSync  time.Time `json:"last_sync,omitempty"`
	// TrustRoot is the key peer records must be signed under, and
	// TrustSource where this node learned it.
	TrustRoot   string `json:"trust_root,omitempty"`
	TrustSource string `json:"trust_source,omitempty"`
	// RefusedRecords counts peer records not applied because their
	// signature did not verify; LastRefusal says why the latest was.
	RefusedRecords uint64 `json:"refused_records"`
	LastRefusal    string `json:"last_refusal,omitempty"`
	// PSKReady says the registrar has told this node its pairs'
	// preshared keys; PSKError why it could not, last time.
	PSKReady bool   `json:"psk_ready"`
	PSKError string `json:"psk_error,omitempty"`
}

// PeerStatus is one peer as the node sees it.
type PeerStatus struct {
	Machine         string    `json:"machine"`
	PublicKey       string    `json:"public_key"`
	MeshIP          string    `json:"mesh_ip,omitempty"`
	Endpoint        string    `json:"endpoint,omitempty"`
	Active          bool      `json:"active"` // in the device config
	Liveness        string    `json:"liveness"`
	LastHandshake   time.Time `json:"last_handshake,omitempty"`
	HandshakeAgeSec float64   `json:"handshake_age_seconds,omitempty"`
	RxBytes         uint64    `json:"rx_bytes"`
	TxBytes         uint64    `json:"tx_bytes"`
	// PSK says the tunnel uses the pair's preshared key.
	PSK bool `json:"psk"`
	// Key is KeyPrevious for the key a peer rotated away from, which
	// the device accepts until PreviousUntil; empty for its current key.
	Key           string    `json:"key,omitempty"`
	PreviousUntil time.Time `json:"previous_until,omitempty"`
	// KeySince is when the peer's current key was registered.
	KeySince time.Time `json:"key_since,omitempty"`
	// Path is how the device reaches the peer now, PathDirect or
	// PathRelayed, and PathSince since when.
	Path      string    `json:"path,omitempty"`
	PathSince time.Time `json:"path_since,omitempty"`
}

// KeyPrevious marks a peer's rotated-away key in PeerStatus.Key.
const KeyPrevious = "previous"

// Status snapshots the node.
func (n *Node) Status() (*Status, error) {
	if n.dev == nil {
		return nil, errors.New("device not up")
	}
	actual, err := n.dev.peers()
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	s := &Status{
		Machine: n.st.Machine, MeshIP: n.st.MeshIP, PublicKey: n.key.Public().String(), Mode: n.st.Mode,
		Interface: n.dev.iface, ListenPort: n.dev.port, Member: n.member, NAT: n.nat, Drift: n.lastDrift, Relay: n.relay.status(),
		Control: ControlInfo{URL: n.st.NATSURL, Connected: n.connected, Source: n.source, LastSync: n.lastSync, Watch: "down",
			RefusedRecords: n.refusedRecords, LastRefusal: n.lastRefusal, PSKReady: n.pskReady, PSKError: n.pskErr},
	}
	if st := n.storeP.Load(); st != nil {
		if _, a, err := st.Trust(context.Background()); err == nil {
			s.Control.TrustRoot, s.Control.TrustSource = a.Root, a.Source
		}
	}
	if n.watchUp {
		s.Control.Watch = "live"
	} else if !n.watchLostAt.IsZero() && time.Since(n.watchLostAt) > n.cfg.WatchFallback {
		s.Control.Watch = "polling"
	}
	now := time.Now()
	n.observePaths(actual, now)
	seen := map[Key]bool{}
	for machine, rec := range n.peers {
		if machine == n.st.Machine {
			continue
		}
		k, err := ParseKey(rec.PublicKey)
		if err != nil {
			continue
		}
		ps := PeerStatus{Machine: machine, PublicKey: rec.PublicKey, MeshIP: rec.MeshIP, Liveness: store.LivenessUnknown}
		if rec.Static {
			ps.Liveness = "static"
		} else {
			ps.KeySince = rec.KeyAge()
		}
		if hb, ok := n.beats[machine]; ok && !rec.Static {
			ps.Liveness = hb.Liveness(n.beatsAt)
		}
		if a, ok := actual[k]; ok {
			fillDev(&ps, a, now)
			ps.Path, ps.PathSince = n.peerPath(k)
		}
		seen[k] = true
		s.Peers = append(s.Peers, ps)
		if prev, err := ParseKey(rec.PreviousKey); err == nil && prev != k {
			if a, ok := actual[prev]; ok {
				old := PeerStatus{Machine: machine, PublicKey: rec.PreviousKey, MeshIP: rec.MeshIP, Liveness: ps.Liveness,
					Key: KeyPrevious, PreviousUntil: rec.PreviousUntil}
				fillDev(&old, a, now)
				seen[prev] = true
				s.Peers = append(s.Peers, old)
			}
		}
	}
	for k, a := range actual {
		if !seen[k] {
			ps := PeerStatus{Machine: "(unknown)", PublicKey: k.String(), Liveness: store.LivenessUnknown}
			fillDev(&ps, a, now)
			s.Peers = append(s.Peers, ps)
		}
	}
	sort.Slice(s.Peers, func(i, j int) bool {
		if s.Peers[i].Machine != s.Peers[j].Machine {
			return s.Peers[i].Machine < s.Peers[j].Machine
		}
		return s.Peers[i].Key < s.Peers[j].Key // the current key first
	})
	return s, nil
}

func fillDev(ps *PeerStatus, a *devPeer, now time.Time) {
	ps.Active = true
	ps.PSK = a.PSK != Key{}
	ps.Endpoint = a.Endpoint
	ps.RxBytes, ps.TxBytes = a.RxBytes, a.TxBytes
	if !a.LastHandshake.IsZero() {
		ps.LastHandshake = a.LastHandshake.UTC()
		ps.HandshakeAgeSec = now.Sub(a.LastHandshake).Seconds()
	}
}
