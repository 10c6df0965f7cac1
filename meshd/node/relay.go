package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/wgbind"
	"github.com/edgeplane/edgeplane/store"
)

// relayRenewBefore is how long before its credentials expire the node
// takes a fresh allocation: the relay checks them on every refresh, so an
// allocation outlives them by minutes at most.
const relayRenewBefore = time.Hour

// relayRetryMax bounds the backoff between failed attempts to allocate.
const relayRetryMax = time.Hour

// relayInfo is the node's allocation on a mesh relay; n.mu guards it.
type relayInfo struct {
	server  string
	addr    netip.AddrPort // the relayed address peers send to
	expires time.Time
	err     string
	none    bool // the registrar announced no relays
}

// RelayStatus is the node's relay allocation as `meshd status` shows it.
type RelayStatus struct {
	Server string `json:"server,omitempty"`
	// Address is this node's relayed address, announced in its heartbeat.
	Address string    `json:"address,omitempty"`
	Expires time.Time `json:"expires,omitempty"`
	// Error says why the node holds no allocation, last time it tried.
	Error string `json:"error,omitempty"`
}

func (r relayInfo) status() RelayStatus {
	s := RelayStatus{Server: r.server, Expires: r.expires, Error: r.err}
	if r.addr.IsValid() {
		s.Address = r.addr.String()
	}
	if r.none && s.Error == "" {
		s.Error = "the registrar announced no relays (control server --mesh-relay)"
	}
	return s
}

// relayLoop keeps an allocation on a mesh relay while the registrar
// announces one: it asks the registrar for relays and credentials, on its
// own subject with its node secret, allocates on the first relay that
// answers, hands the allocation to the WireGuard bind, and announces the
// relayed address in its heartbeat. It allocates anew before the
// credentials expire, and when the allocation stops answering its probe
// (checked every reconcile interval). Every node holds an allocation, so a peer that finds
// no direct path can reach it without waiting for it to allocate.
func (n *Node) relayLoop(ctx context.Context) {
	var cur *relay.Allocation
	defer func() {
		if cur != nil {
			n.dev.demux.SetRelay(nil)
			cur.Close()
		}
	}()
	t := time.NewTimer(n.cfg.ReconcileInterval)
	defer t.Stop()
	failures := 0
	for {
		n.mu.Lock()
		due := cur == nil || time.Until(n.relay.expires) < relayRenewBefore
		n.mu.Unlock()
		if !due && !n.relayAnswers(ctx, cur) && ctx.Err() == nil {
			// The relay forgot the allocation (it restarted) or cannot
			// be reached: peers sending to the announced address reach
			// nothing, so take a new one and announce that.
			n.log.Warn("the relay allocation stopped answering its probe; allocating anew", zap.Stringer("address", cur.RelayedAddr()))
			n.met.relayLost.Inc()
			due = true
		}
		if due {
			next, err := n.allocate(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				failures++
				n.mu.Lock()
				repeated := n.relay.err == err.Error()
				n.mu.Unlock()
				n.noteRelay(relayInfo{err: err.Error()}, cur != nil)
				if !repeated {
					n.log.Warn("mesh relay", zap.Error(err))
				}
			case next != nil:
				failures = 0
				n.dev.demux.SetRelay(next)
				if cur != nil {
					cur.Close()
				}
				cur = next
				n.log.Info("holding a relayed address", zap.String("relay", next.Server().String()), zap.Stringer("address", next.RelayedAddr()))
				n.heartbeat(ctx)
				n.requestApply()
			}
		}
		// Failures back off (a control plane that predates relays, or
		// credentials without relay.<machine>, refuse every time), up to
		// relayRetryMax; a new connection asks again at once.
		wait := n.cfg.ReconcileInterval
		if failures > 0 {
			wait = min(n.cfg.ReconcileInterval<<min(failures-1, 10), relayRetryMax)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.relayKick:
		}
	}
}

// allocate gets credentials and allocates on the first relay that answers;
// nil without error when there is nothing to do now (not connected, no
// relays announced).
func (n *Node) allocate(ctx context.Context) (*relay.Allocation, error) {
	s := n.storeP.Load()
	if s == nil || !s.NC.IsConnected() {
		return nil, nil
	}
	var rep store.MeshRelayReply
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := store.Call(cctx, s.NC, s.Names.RegistrarSubject("relay."+n.st.Machine), "registrar", "relay",
		store.MeshRelayRequest{Version: store.RecordVersion, Machine: n.st.Machine, Secret: n.st.Secret}, &rep)
	cancel()
	if err != nil {
		if store.HasCode(err, store.CodeUnavailable) {
			err = fmt.Errorf("%w (no registrar answered: is `control server` running, and were this machine's mesh credentials issued by a version that knows relays?)", err)
		}
		return nil, fmt.Errorf("asking for relay credentials: %w", err)
	}
	if len(rep.Servers) == 0 {
		n.noteRelay(relayInfo{none: true}, false)
		return nil, nil
	}
	local := ""
	if n.st.Bind != "" {
		local = net.JoinHostPort(n.st.Bind, "0")
	}
	var errs []error
	for _, server := range rep.Servers {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		a, err := relay.Allocate(actx, relay.ClientConfig{Server: server, Username: rep.Username, Password: rep.Password,
			Local: local, Logger: n.log.Named("relay")})
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n.noteRelay(relayInfo{server: server, addr: a.RelayedAddr(), expires: rep.Expires}, false)
		return a, nil
	}
	return nil, errors.Join(errs...)
}

// noteRelay records the allocation (or why there is none); keep leaves a
// working allocation's details in place and only records the error.
func (n *Node) noteRelay(r relayInfo, keep bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if keep {
		n.relay.err = r.err
		return
	}
	n.relay = r
}

// relayProbeWait is how long a relay probe may take to come back.
const relayProbeWait = 2 * time.Second

// relayAnswers sends a probe through the allocation to its own relayed
// address and waits for the relay to deliver it back, twice before giving
// up (it is UDP).
func (n *Node) relayAnswers(ctx context.Context, a *relay.Allocation) bool {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	probe := wgbind.RelayProbe(nonce)
	to := net.UDPAddrFromAddrPort(a.RelayedAddr())
	for range 2 {
		if _, err := a.WriteTo(probe, to); err != nil {
			return false
		}
		t := time.NewTimer(relayProbeWait)
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				t.Stop()
				return true // shutting down: not the relay's fault
			case echo := <-n.relayEchoes:
				if echo == string(probe) {
					t.Stop()
					return true
				}
			case <-t.C:
				waiting = false
			}
		}
	}
	return false
}
