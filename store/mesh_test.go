package store_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

func TestMeshLiveness(t *testing.T) {
	now := time.Now()
	iv := 30 * time.Second
	cases := []struct {
		age  time.Duration
		want string
	}{
		{0, store.LivenessAlive},
		{2*iv + iv/2, store.LivenessAlive},
		{3 * iv, store.LivenessUnreachable},
		{9*iv + iv/2, store.LivenessUnreachable},
		{10 * iv, store.LivenessOffline},
	}
	for _, c := range cases {
		hb := &store.MeshHeartbeat{At: now.Add(-c.age), Interval: store.Duration(iv)}
		if got := hb.Liveness(now); got != c.want {
			t.Errorf("age %s: %s, want %s", c.age, got, c.want)
		}
	}
	var nilHB *store.MeshHeartbeat
	if nilHB.Liveness(now) != store.LivenessUnknown {
		t.Error("nil heartbeat not unknown")
	}
}

func TestMeshIPKeys(t *testing.T) {
	ip := netip.MustParseAddr("10.100.3.7")
	for _, k := range []string{store.MeshIPKey(ip), store.MeshIPCooldownKey(ip)} {
		got, err := store.MeshIPFromKey(k)
		if err != nil || got != ip {
			t.Fatalf("%s: %v %v", k, got, err)
		}
	}
	if _, err := store.MeshIPFromKey("ip.not-an-ip"); err == nil {
		t.Fatal("bad key parsed")
	}
}
