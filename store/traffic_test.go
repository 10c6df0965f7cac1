package store

import (
	"math"
	"testing"
)

func TestLatencyQuantile(t *testing.T) {
	b := make([]uint64, len(TrafficLatencyBounds)+1)
	if q := LatencyQuantile(0.5, b); q != 0 {
		t.Errorf("empty: %v", q)
	}
	if q := LatencyQuantile(0.5, b[:3]); q != 0 {
		t.Errorf("another layout: %v", q)
	}
	b[0] = 10 // ≤ 1 ms
	if q := LatencyQuantile(0.5, b); math.Abs(q-0.0005) > 1e-9 {
		t.Errorf("p50 of ten under 1 ms: %v", q)
	}
	b[len(b)-1] = 90 // over 10 s
	if q := LatencyQuantile(0.99, b); q != 10 {
		t.Errorf("p99 in the overflow bucket: %v, want its lower bound", q)
	}
}
