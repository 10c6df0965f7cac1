package fleetsim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Gateways are simulated gateways: the real routing projection a gateway
// runs, each on its own connection (with gateway credentials when the
// Dialer has them) and reporting under its own name, without the HTTP
// server in front. Each remembers when its view reached which sequence.
type Gateways struct {
	Names []string
	projs []*projection.Projection

	mu      sync.Mutex
	reached [][]reachedAt // per gateway, in sequence order

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type reachedAt struct {
	seq uint64
	at  time.Time
}

// StartGateways starts n simulated gateways named gw00000.. until ctx ends
// or Stop.
func StartGateways(ctx context.Context, n int, dial func(ctx context.Context, name string) (*store.Store, error)) (*Gateways, error) {
	ctx, cancel := context.WithCancel(ctx)
	g := &Gateways{cancel: cancel, reached: make([][]reachedAt, n)}
	for i := range n {
		name := fmt.Sprintf("gw%05d", i)
		s, err := dial(ctx, name)
		if err != nil {
			g.Stop()
			return nil, err
		}
		p, err := projection.New(projection.Config{Store: s, Name: name})
		if err != nil {
			s.NC.Close()
			g.Stop()
			return nil, err
		}
		g.Names = append(g.Names, name)
		g.projs = append(g.projs, p)
		g.wg.Add(2)
		go func() {
			defer g.wg.Done()
			defer s.NC.Close()
			_ = p.Run(ctx)
		}()
		go func() {
			defer g.wg.Done()
			g.follow(ctx, i, p)
		}()
	}
	return g, nil
}

// follow notes each sequence p's view reaches, and when.
func (g *Gateways) follow(ctx context.Context, i int, p *projection.Projection) {
	for {
		ch := p.Changed()
		seq, now := p.View().Seq, time.Now()
		g.mu.Lock()
		if r := g.reached[i]; len(r) == 0 || r[len(r)-1].seq < seq {
			g.reached[i] = append(r, reachedAt{seq, now})
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// Reached says when each gateway's view first reached seq, as the time
// since from; ok is false if one has not yet.
func (g *Gateways) Reached(seq uint64, from time.Time) (lags []time.Duration, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.reached {
		i, _ := slices.BinarySearchFunc(r, seq, func(x reachedAt, s uint64) int { return cmp.Compare(x.seq, s) })
		if i == len(r) {
			return nil, false
		}
		lags = append(lags, r[i].at.Sub(from))
	}
	return lags, true
}

// WaitReached waits up to wait for every gateway to reach seq and returns
// their lags from from.
func (g *Gateways) WaitReached(ctx context.Context, seq uint64, from time.Time, wait time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(wait)
	for {
		if lags, ok := g.Reached(seq, from); ok {
			return lags, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not every gateway applied routing sequence %d within %s", seq, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Stop ends the gateways.
func (g *Gateways) Stop() {
	g.cancel()
	g.wg.Wait()
}
