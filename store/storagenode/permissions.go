package storagenode

// What each role may do: the subject permissions and limits a user JWT
// carries, so that any storage node enforces them without a user list.

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/store"
)

// roleLimits are the per-user limits of each untrusted role: the largest
// message it may publish (a certificate chain for a gateway, a record for
// the others).
var roleLimits = map[string]int64{
	RoleGateway: int64(store.MaxCertValue) + 64<<10,
	RoleAgent:   64 << 10,
	RoleMesh:    64 << 10,
}

// RolePermissions are the subject permissions of role. Untrusted roles are
// users of the edge account: they reach the JetStream API and KV writes
// under store.EdgeAPIPrefix, read only by stream info and direct gets (no
// consumer), follow changes on what streams republish, and write only keys
// their identity names. A gateway is always bound to a name (machine) and
// reports its routing progress and traffic under that name only.
func RolePermissions(role, machine string, n store.Names) (jwt.Permissions, error) {
	var p jwt.Permissions
	needMachine := role == RoleAgent || role == RoleMesh
	if needMachine && !store.ValidToken(machine) {
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("role %s needs --machine ID (letters, digits, '-', '_'), got %q", role, machine)}
	}
	// A gateway writes its observation and its traffic report under its
	// name; credentials without one would write every gateway's, and so
	// decide a canary alone (issue 36).
	if role == RoleGateway && store.GatewayKey(machine) == "" {
		return p, store.Errorf(store.CodeInvalid, "role gateway needs --machine NAME: the gateway_name it reports under, got none").With("role", role)
	}
	if !needMachine && machine != "" && role != RoleGateway {
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("role %s is not bound to a machine", role)}
	}
	if role == RoleControl {
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
		return p, nil
	}
	api := store.EdgeAPIPrefix + "."
	// read lets a role read a whole stream by direct gets (bucket streams
	// are "KV_<bucket>").
	read := func(stream string) {
		p.Pub.Allow.Add(api+"DIRECT.GET."+stream, api+"DIRECT.GET."+stream+".>")
	}
	readKV := func(bucket string) { read("KV_" + bucket) }
	// readKey lets a role read only keys matching key of a bucket (the
	// last-by-subject form of a direct get names the key).
	readKey := func(bucket, key string) {
		p.Pub.Allow.Add(api + "DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + key)
	}
	writeKV := func(bucket, key string) { p.Pub.Allow.Add(api + "$KV." + bucket + "." + key) }
	// Binding a stream or bucket reads its info (config and counts), which
	// the store does when a role first uses one for more than a key's get
	// or put.
	p.Pub.Allow.Add(api + "STREAM.INFO.*")
	// The store's floor, which every process checks at start (a process
	// too old for the store refuses to run) and an agent watches (it
	// writes instance states where old readers read them until the
	// floor says none is left). Never written: the control plane raises it.
	readKey(n.MetaBucket(), "floor")
	// Answers to this user's own requests only (see InboxPrefix); the
	// user's key is not known yet, so the prefix is added when signing.
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	switch role {
	case RoleGateway:
		// What the custom Caddy (and a standalone edgeplane-dns) does,
		// as run end to end in integration's gateway-credentials test.
		// Projection load: the last signed event of every routing
		// subject; then the events from the loaded sequence on, as
		// republished and by direct gets; the signer certificates they
		// are verified with, and their changes.
		read(n.RoutingEventsStream())
		readKV(n.SignersBucket())
		p.Sub.Allow.Add(n.RoutingRepublishedWildcard(), n.SignersRepublishedWildcard())
		// The control plane's judgement of machine liveness, read (never
		// written) to set aside the instances of a machine that stopped
		// beating. Not the beats themselves: one message per change, not
		// one per beat of every machine.
		readKV(n.MachineLivenessBucket())
		p.Sub.Allow.Add(n.MachineLivenessRepublishedWildcard())
		// The routing observation `control deploy apply` waits for, under
		// the gateway's own name only.
		gw := store.GatewayKey(machine)
		writeKV(n.GatewaysBucket(), gw)
		// Its traffic counters, under the same name.
		writeKV(n.GatewayTrafficBucket(), gw)
		// Its rate-limit counts, under its name only, and every
		// gateway's: one gateway cannot speak for another.
		p.Pub.Allow.Add(n.RateCountsSubject(machine))
		p.Sub.Allow.Add(n.RateCountsWildcard())
		// Its access lines, on subjects naming it: published, never read
		// (the control plane reads them, and the access-log stream
		// keeps them), so a gateway can neither pose as another in
		// `control logs --access` nor read another's lines.
		p.Pub.Allow.Add(n.AccessSubject("*", "*", machine))
		// The key it signs and checks canary bucket cookies with: read,
		// never written (the control plane makes it), so a gateway cannot
		// change the key every other gateway trusts.
		readKV(n.CanaryKeysBucket())
		// Certificate storage (caddy.storage.edgeplane): certificates,
		// keys, ACME accounts and challenge tokens are read and written.
		readKV(n.CertsBucket())
		writeKV(n.CertsBucket(), ">")
		// Its locks, as leases: read (holder, fencing) and written, but
		// only certificate, ACME account and certmagic lock keys, never a
		// deploy or subnet lock.
		readKV(n.LocksBucket())
		for _, k := range []string{"cp.lock.cert.>", "cp.lock.acme_account.>", "cp.lock.certmagic.>"} {
			writeKV(n.LocksBucket(), k)
		}
		// The fleet's ACME order budget (compare-and-set on a record per
		// registered domain) and the certificate status records.
		for _, b := range []string{n.AcmeBudgetBucket(), n.CertStatusBucket()} {
			readKV(b)
			writeKV(b, ">")
		}
		// Renewal work: pulls from the consumer the control plane
		// provisions, acknowledgements, and the next item's schedule.
		renewals := n.CertRenewalsStream()
		p.Pub.Allow.Add(api+"CONSUMER.INFO."+renewals+"."+store.RenewalsConsumer,
			api+"CONSUMER.MSG.NEXT."+renewals+"."+store.RenewalsConsumer,
			"$JS.ACK."+renewals+"."+store.RenewalsConsumer+".>", n.CertRenewalsWildcard())
		// A lease's quorum check asks the storage nodes which are missing
		// when no stream leader answers (CheckQuorum).
		p.Pub.Allow.Add(n.StorageStatusSubject())
		// Renewing its own credentials, under its name: a gateway bound to
		// none renews nothing (it is given new credentials).
		if machine != "" {
			p.Pub.Allow.Add(n.CredsSubject("*", RoleGateway, store.CredsSubjectID(machine)))
		}
	case RoleAgent:
		// Only its own machine's instance records, machine record and mesh
		// peer record: the keys name the machine (InstanceKey), so one
		// agent cannot read or write another machine's.
		readKey(n.InstancesBucket(), store.InstanceKey("*", machine, "*"))
		writeKV(n.InstancesBucket(), store.InstanceKey("*", machine, "*"))
		readKey(n.MachinesBucket(), machine)
		readKey(n.MeshPeersBucket(), store.MeshPeerKey(machine))
		// What it runs and that it is alive, under its own key only.
		writeKV(n.MachineStatesBucket(), machine)
		writeKV(n.MachineBeatsBucket(), machine)
		// What it sees of its instances, under its own key: a reader
		// applies it only to instance records naming this machine.
		writeKV(n.ObservedBucket(), machine)
		// Its peer record is signed: the certificates to verify it.
		readKV(n.SignersBucket())
		// Releases to upgrade this box to: the signed records and the
		// binaries' chunks, read by direct gets; never written.
		readKV(n.ReleasesBucket())
		read("OBJ_" + n.ReleaseBinariesStore())
		// Its own RPC subject, and requests on its own machine's subjects:
		// admission (the control plane redeems the invite and writes the
		// machine record) and routing republish (an agent publishes no
		// routing event: it asks the control plane to republish a service
		// from stored state after one of its instances changes).
		p.Sub.Allow.Add(n.NodeListenSubject(machine))
		p.Pub.Allow.Add(n.RoutingRepublishSubject(machine), n.AdmissionSubject("*", machine))
		// Renewing its own credentials.
		p.Pub.Allow.Add(n.CredsSubject("*", RoleAgent, store.CredsSubjectID(machine)))
	case RoleMesh:
		readKV(n.MeshPeersBucket())
		readKV(n.MeshHeartbeatsBucket())
		readKV(n.SignersBucket())
		p.Sub.Allow.Add(n.MeshPeersRepublishedWildcard(), n.SignersRepublishedWildcard())
		writeKV(n.MeshHeartbeatsBucket(), store.MeshBeatKey(machine))
		writeKV(n.MeshDriftBucket(), store.MeshDriftKey(machine))
		// Only its own machine's registrar subjects: credentials for one
		// machine cannot register (or remove) another, or be told the
		// preshared keys of another's pairs, rotate another's key or get
		// relay credentials in another's name.
		p.Pub.Allow.Add(n.RegistrarSubject("register."+machine), n.RegistrarSubject("leave."+machine),
			n.RegistrarSubject("psk."+machine), n.RegistrarSubject("rotate."+machine), n.RegistrarSubject("relay."+machine))
		// Renewing its own credentials.
		p.Pub.Allow.Add(n.CredsSubject("*", RoleMesh, store.CredsSubjectID(machine)))
	default:
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("unknown role %q: want one of %s", role, strings.Join(Roles, ", "))}
	}
	return p, nil
}
