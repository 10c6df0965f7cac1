package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Reads and writes of the mesh's records other than peer records: the
// registrar's IP allocations and cooldowns (written under the subnet lease,
// by control servers only), and each node's heartbeat and drift report
// (written by the node, under its own machine's key only). Each write keys
// the record by what its body names.

// PutMeshBeat records a node's heartbeat.
func (s *Store) PutMeshBeat(ctx context.Context, hb MeshHeartbeat) error {
	hb.Version = RecordVersion
	hb.Release, hb.Generation = Announcement()
	_, err := PutJSON(ctx, s.meshBeats, MeshBeatKey(hb.Machine), &hb)
	return err
}

// PutMeshDrift records what a node's last reconcile found.
func (s *Store) PutMeshDrift(ctx context.Context, rep MeshDriftReport) error {
	rep.Version = RecordVersion
	_, err := PutJSON(ctx, s.meshDrift, MeshDriftKey(rep.Machine), &rep)
	return err
}

// DeleteMeshObservations removes machine's heartbeat and drift report,
// which are noise once it left the mesh. Ones already gone are no error.
func (s *Store) DeleteMeshObservations(ctx context.Context, machine string) error {
	for _, d := range []struct {
		kv  jetstream.KeyValue
		key string
	}{{s.meshBeats, MeshBeatKey(machine)}, {s.meshDrift, MeshDriftKey(machine)}} {
		if err := d.kv.Delete(ctx, d.key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return classify(fmt.Errorf("removing the mesh observations of %s: %w", machine, err))
		}
	}
	return nil
}

// MeshIP reads the allocation of ip and its revision.
func (s *Store) MeshIP(ctx context.Context, ip netip.Addr) (*MeshIPAllocation, uint64, error) {
	var a MeshIPAllocation
	rev, err := GetJSON(ctx, s.meshIPs, MeshIPKey(ip), &a)
	if err != nil {
		return nil, 0, err
	}
	return &a, rev, nil
}

// PutMeshIP records the allocation a.
func (s *Store) PutMeshIP(ctx context.Context, a *MeshIPAllocation) error {
	ip, err := netip.ParseAddr(a.IP)
	if err != nil {
		return Errorf(CodeInvalid, "mesh ip allocation %q: %w", a.IP, err)
	}
	a.Version = RecordVersion
	_, err = PutJSON(ctx, s.meshIPs, MeshIPKey(ip), a)
	return err
}

// ReleaseMeshIP deletes the allocation of ip if it is still at revision
// rev (the one its release was decided on).
func (s *Store) ReleaseMeshIP(ctx context.Context, ip netip.Addr, rev uint64) error {
	if err := s.meshIPs.Delete(ctx, MeshIPKey(ip), jetstream.LastRevision(rev)); err != nil {
		return classify(fmt.Errorf("releasing %s: %w", ip, err))
	}
	return nil
}

// PutMeshIPCooldown records that c.IP cools down until c.Until; the marker
// removes itself after ttl.
func (s *Store) PutMeshIPCooldown(ctx context.Context, c *MeshIPCooldown, ttl time.Duration) error {
	ip, err := netip.ParseAddr(c.IP)
	if err != nil {
		return Errorf(CodeInvalid, "mesh ip cooldown %q: %w", c.IP, err)
	}
	c.Version = RecordVersion
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	key := MeshIPCooldownKey(ip)
	_, err = s.meshIPs.Create(ctx, key, data, jetstream.KeyTTL(ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// Released before and still cooling down: the later release
		// counts. A put would carry no TTL and leave the marker for good,
		// so the old one goes and the new one is created with its own.
		if err = s.meshIPs.Delete(ctx, key); err == nil {
			_, err = s.meshIPs.Create(ctx, key, data, jetstream.KeyTTL(ttl))
		}
	}
	if err != nil {
		return classify(fmt.Errorf("writing cooldown for %s: %w", ip, err))
	}
	return nil
}

// ListMeshIPs calls fn with every allocation.
func (s *Store) ListMeshIPs(ctx context.Context, fn func(*MeshIPAllocation) error) error {
	return ListJSON(ctx, s, s.meshIPs, "ip.>", func(_ string, a *MeshIPAllocation) error { return fn(a) })
}

// ListMeshIPCooldowns calls fn with every cooldown marker.
func (s *Store) ListMeshIPCooldowns(ctx context.Context, fn func(*MeshIPCooldown) error) error {
	return ListJSON(ctx, s, s.meshIPs, "cooldown.>", func(_ string, c *MeshIPCooldown) error { return fn(c) })
}

// MeshHeartbeatOf reads the last heartbeat of machine's mesh node; a node
// never heard is not_found.
func (s *Store) MeshHeartbeatOf(ctx context.Context, machine string) (*MeshHeartbeat, error) {
	var hb MeshHeartbeat
	if _, err := GetJSON(ctx, s.meshBeats, MeshBeatKey(machine), &hb); err != nil {
		return nil, err
	}
	return &hb, nil
}
