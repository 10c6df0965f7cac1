package store

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Every wire record decoder takes untrusted bytes from the store or the
// network: bad input must be a clear error, never a panic.

func recordSeeds(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `"x"`, `{"version":1}`, `{"version":2}`, `{"version":-1}`,
		`{"version":1e400}`, `{"version":"1"}`, `{"version":1,"id":"d1","kind":"final","slots":[{"slot":1}]}`,
		`{"version":1,"timeout":"5s"}`, `{"version":1,"interval":12345}`, `{"version":1,"interval":"bogus"}`,
		`{"version":1,"kind":"service.upsert","endpoints":[{"port":-1}],"machine":{"version":1}}`,
		`{"version":1,"manifest":{"services":{"web":{"replicas":-3,"readiness":{"timeout":"1h"}}}}}`,
		`{"version":1,"peers":[{"name":"s1","active":"3s"}],"streams":[{"name":"x"}]}`,
		`{"version":1,"at":"not a time"}`, "{\"version\":1,\"id\":\"\xff\xfe\"}", `{"version":1,"labels":{"a":1}}`,
		strings.Repeat(`{"a":`, 1000), `{"version":1,"error":{"code":"busy","detail":{"k":"v"}}}`,
	} {
		f.Add([]byte(s))
	}
}

func FuzzDecodeRecords(f *testing.F) {
	recordSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		recs := []record{
			&DeployCommit{}, &DeployStatus{}, &PhaseRecord{}, &InstanceRecord{}, &MachineRecord{}, &Invite{},
			&RoutingEvent{}, &GatewayObservation{}, &LeaseHolder{}, &MeshPeerRecord{}, &MeshHeartbeat{},
			&MeshDriftReport{}, &MeshIPAllocation{}, &MeshIPCooldown{}, &StorageNodeStatus{}, &Revocation{},
		}
		for _, r := range recs {
			err := Decode("fuzz", data, r)
			if err == nil {
				if r.version() > RecordVersion {
					t.Fatalf("%T: accepted newer version %d", r, r.version())
				}
				// A decoded record encodes again (it is a plain value).
				if _, err := json.Marshal(r); err != nil {
					t.Fatalf("%T: decoded but does not encode: %v", r, err)
				}
				continue
			}
			if !strings.Contains(err.Error(), "fuzz") {
				t.Fatalf("%T: error does not name the record: %v", r, err)
			}
		}
		var d Duration
		_ = d.UnmarshalJSON(data)
		if ev := (&RoutingEvent{}); Decode("routing event", data, ev) == nil {
			_ = ev.Identity()
		}
		if hb := (&MeshHeartbeat{}); Decode("heartbeat", data, hb) == nil {
			_ = hb.Liveness(time.Now())
		}
		// Credentials files come from operators' disks.
		_, _ = UserOfCreds(data)
	})
}

func FuzzKeySafe(f *testing.F) {
	for _, s := range []string{"", ".", "..", "a.b", "a..b", ".a", "a.", "Shop.Example.COM.", "_", "_zz", "_4", "ü", "a b", "*", ">"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k := KeySafe(s)
		back, err := DecodeKeySafe(k)
		if err != nil || back != s {
			t.Fatalf("KeySafe(%q) = %q decodes to %q, %v", s, k, back, err)
		}
		if strings.ContainsAny(k, " *>\t\r\n") || strings.Contains(k, "..") || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") {
			t.Fatalf("KeySafe(%q) = %q is not a valid key", s, k)
		}
		// Arbitrary input to the decoder: an error, never a panic.
		_, _ = DecodeKeySafe(s)
		_, _ = MeshIPFromKey(s)
	})
}

// FuzzCredsFile: a credentials file of any content is rejected with a clear
// error before anything connects.
func FuzzCredsFile(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n"))
	f.Add([]byte("SUAxxxxxxxx"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "fuzz.creds")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := credsOptions(p); err == nil {
			// Only a real user JWT passes; then nats.go still checks the seed.
			return
		}
	})
}
