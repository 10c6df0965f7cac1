package store

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Every stream and bucket the layout provisions has its durability decided
// here, by name: a new one fails this test until it is classified (and
// Provision refuses it), and a decision cannot flip unnoticed.
func TestEveryStreamAndBucketHasADurability(t *testing.T) {
	names, err := NewNames("", "")
	if err != nil {
		t.Fatal(err)
	}
	n := names
	kv := func(bucket string) string { return "KV_" + bucket }
	want := map[string]Durability{
		n.DeployCommitsStream():         DurabilitySynced,
		n.RoutingEventsStream():         DurabilitySynced,
		n.CertRenewalsStream():          DurabilitySynced,
		kv(n.CertsBucket()):             DurabilitySynced,
		kv(n.DeployStatusBucket()):      DurabilitySynced,
		kv(n.DeployPhasesBucket()):      DurabilitySynced,
		kv(n.InstancesBucket()):         DurabilitySynced,
		kv(n.MachinesBucket()):          DurabilitySynced,
		kv(n.LocksBucket()):             DurabilitySynced,
		kv(n.InvitesBucket()):           DurabilitySynced,
		kv(n.CertStatusBucket()):        DurabilitySynced,
		kv(n.AcmeBudgetBucket()):        DurabilitySynced,
		kv(n.MeshPeersBucket()):         DurabilitySynced,
		kv(n.MeshIPsBucket()):           DurabilitySynced,
		kv(n.MeshKeysBucket()):          DurabilitySynced,
		kv(n.DashboardTokensBucket()):   DurabilitySynced,
		kv(n.DashboardSessionsBucket()): DurabilitySynced,
		kv(n.ReleasesBucket()):          DurabilitySynced,
		kv(n.RolloutsBucket()):          DurabilitySynced,
		kv(n.CanaryDecisionsBucket()):   DurabilitySynced,
		kv(n.CanaryKeysBucket()):        DurabilitySynced,
		kv(n.RevocationsBucket()):       DurabilitySynced,
		kv(n.CredentialsBucket()):       DurabilitySynced,
		kv(n.SignersBucket()):           DurabilitySynced,
		kv(n.HostsBucket()):             DurabilitySynced,
		kv(n.MachineStatesBucket()):     DurabilitySynced,
		kv(n.ObservedBucket()):          DurabilitySynced,
		kv(n.FleetStatusBucket()):       DurabilitySynced,
		kv(n.MetaBucket()):              DurabilitySynced,
		kv(n.MachineBeatsBucket()):      DurabilityRewritten,
		kv(n.MeshHeartbeatsBucket()):    DurabilityRewritten,
		kv(n.MeshDriftBucket()):         DurabilityRewritten,
		kv(n.GatewaysBucket()):          DurabilityRewritten,
		kv(n.GatewayTrafficBucket()):    DurabilityRewritten,
		kv(n.MachineLivenessBucket()):   DurabilityRewritten,
		n.AccessLogsStream():            DurabilityRewritten,
	}
	got := (&Store{Names: names}).Durabilities()
	for name, d := range got {
		switch w, ok := want[name]; {
		case d == "":
			t.Errorf("%s: no durability: classify it in durabilityOf", name)
		case !ok:
			t.Errorf("%s is %s, and this table does not name it: add it", name, d)
		case d != w:
			t.Errorf("%s is %s, want %s", name, d, w)
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("%s is in the table but not in the layout", name)
		}
	}
	if len(got) != len((&Store{Names: names}).StreamNames()) {
		t.Errorf("%d classified, %d streams in the layout", len(got), len((&Store{Names: names}).StreamNames()))
	}
}

// Only a rewritten observation on a single, unreplicated storage node is
// left unsynced; a replicated stream or any stream of a cluster (which may
// gain replicas) is synced, since JetStream refuses async persistence on a
// replicated stream and refuses changing a stream's persist mode later.
func TestPersistMode(t *testing.T) {
	for _, tc := range []struct {
		d         Durability
		clustered bool
		replicas  int
		want      jetstream.PersistModeType
	}{
		{DurabilityRewritten, false, 1, jetstream.AsyncPersistMode},
		{DurabilityRewritten, true, 1, jetstream.DefaultPersistMode},
		{DurabilityRewritten, true, 3, jetstream.DefaultPersistMode},
		{DurabilitySynced, false, 1, jetstream.DefaultPersistMode},
		{DurabilitySynced, true, 3, jetstream.DefaultPersistMode},
	} {
		if got := persistMode(tc.d, tc.clustered, tc.replicas); got != tc.want {
			t.Errorf("persistMode(%s, clustered %v, %d replicas) = %v, want %v", tc.d, tc.clustered, tc.replicas, got, tc.want)
		}
	}
}
