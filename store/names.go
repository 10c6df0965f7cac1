package store

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Default scope of every name when the operator does not choose one.
const (
	DefaultInstallation = "local"
	DefaultAuthority    = "default"
)

// Names derives every NATS name of one installation and authority. The zero
// value is not valid; use NewNames.
type Names struct {
	Installation string
	Authority    string
}

var tokenRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// NewNames validates inst and auth (empty means the default) as single subject
// tokens and returns their Names.
func NewNames(inst, auth string) (Names, error) {
	if inst == "" {
		inst = DefaultInstallation
	}
	if auth == "" {
		auth = DefaultAuthority
	}
	if !tokenRe.MatchString(inst) {
		return Names{}, fmt.Errorf("installation %q: must match %s", inst, tokenRe)
	}
	if !tokenRe.MatchString(auth) {
		return Names{}, fmt.Errorf("authority %q: must match %s", auth, tokenRe)
	}
	return Names{Installation: inst, Authority: auth}, nil
}

// ValidToken reports whether s can stand as one NATS subject token in our
// names (machine IDs, namespaces, services).
func ValidToken(s string) bool { return tokenRe.MatchString(s) }

// Streams.

// DeployCommitsStream holds immutable deploy commits (durable intent).
func (n Names) DeployCommitsStream() string { return "cp_deploy_commits_" + n.Authority }

// RoutingEventsStream holds the ordered routing events the projections consume.
func (n Names) RoutingEventsStream() string { return "routing_events_" + n.Authority }

// CertRenewalsStream holds scheduled certificate renewal work items.
func (n Names) CertRenewalsStream() string { return "cp_cert_renewals_" + n.Authority }

// AccessLogsStream holds the last hour of the access lines gateways
// publish, for `control logs --access --since`.
func (n Names) AccessLogsStream() string { return "access_logs_" + n.Authority }

// AccessLogsWildcard matches every access line of the authority.
func (n Names) AccessLogsWildcard() string { return n.subjectPrefix() + ".access.>" }

// KV buckets.

func (n Names) DeployStatusBucket() string   { return "cp_deploy_status_" + n.Authority }
func (n Names) DeployPhasesBucket() string   { return "cp_deploy_phases_" + n.Authority }
func (n Names) InstancesBucket() string      { return "cp_instances_" + n.Authority }
func (n Names) MachinesBucket() string       { return "cp_machines_" + n.Authority }
func (n Names) LocksBucket() string          { return "cp_locks_" + n.Authority }
func (n Names) InvitesBucket() string        { return "cp_invites_" + n.Authority }
func (n Names) CertsBucket() string          { return "cp_certs_" + n.Authority }
func (n Names) CertStatusBucket() string     { return "cp_cert_status_" + n.Authority }
func (n Names) AcmeBudgetBucket() string     { return "cp_acme_budget_" + n.Authority }
func (n Names) MeshPeersBucket() string      { return "cp_mesh_peers_" + n.Authority }
func (n Names) MeshHeartbeatsBucket() string { return "cp_mesh_heartbeats_" + n.Authority }
func (n Names) MeshIPsBucket() string        { return "cp_mesh_ips_" + n.Authority }
func (n Names) MeshDriftBucket() string      { return "cp_mesh_drift_" + n.Authority }

// MeshKeysBucket holds the mesh's control-plane secrets (the key per-pair
// preshared keys are derived from): the control plane's alone.
func (n Names) MeshKeysBucket() string { return "cp_mesh_keys_" + n.Authority }

// CredentialsBucket records every user key issued to a box, by its public
// key (CredentialRecord): the control plane's alone.
func (n Names) CredentialsBucket() string { return "cp_credentials_" + n.Authority }

// RevocationsBucket lists refused credentials, by user public key.
func (n Names) RevocationsBucket() string { return "cp_revocations_" + n.Authority }

// HostsBucket says which namespace owns each routed host (HostClaim):
// control role only.
func (n Names) HostsBucket() string { return "cp_hosts_" + n.Authority }

// SignersBucket holds the signer certificates and the trust root's record
// (see SignerRecord): written by holders of the trust root only, read by
// every reader of signed intent.
func (n Names) SignersBucket() string { return "cp_signers_" + n.Authority }

// MachineStatesBucket holds what each machine's agent runs (MachineState);
// MachineBeatsBucket its heartbeats (MachineBeat). Agents write their own
// machine's key only.
func (n Names) MachineStatesBucket() string { return "cp_machine_state_" + n.Authority }
func (n Names) MachineBeatsBucket() string  { return "cp_machine_beats_" + n.Authority }

// ObservedBucket holds what each machine's agent last saw of the
// instances it runs (MachineObserved), under its own key only. Unlike the
// live observations it is status, carried with the instance records: an
// agent writes it again only when something changes.
func (n Names) ObservedBucket() string { return "cp_observed_" + n.Authority }

// MachineLivenessBucket holds the control plane's judgement of which
// machines stopped beating (LivenessRecord), written by the aggregator.
func (n Names) MachineLivenessBucket() string { return "cp_machine_liveness_" + n.Authority }

// FleetStatusBucket holds each namespace's fleet summary
// (NamespaceStatus), written by the control server's aggregator.
func (n Names) FleetStatusBucket() string { return "cp_fleet_status_" + n.Authority }

// GatewaysBucket holds each gateway's applied routing sequence: a live
// observation with a short bucket TTL, never truth.
func (n Names) GatewaysBucket() string { return "cp_gateways_" + n.Authority }

// DashboardTokensBucket holds the dashboard's login tokens, hashed
// (DashboardToken); only the control role reads it.
func (n Names) DashboardTokensBucket() string { return "cp_dashboard_tokens_" + n.Authority }

// DashboardSessionsBucket holds the dashboard's logins under way
// (DashboardSession), keyed by the hash of their cookie; only the
// control role reads it.
func (n Names) DashboardSessionsBucket() string { return "cp_dashboard_sessions_" + n.Authority }

// GatewayTrafficBucket holds each gateway's per-service traffic counters
// (GatewayTraffic): an observation with a short bucket TTL, never truth.
func (n Names) GatewayTrafficBucket() string { return "cp_gateway_traffic_" + n.Authority }

// ReleasesBucket holds the signed release records (ReleaseRecord).
func (n Names) ReleasesBucket() string { return "cp_releases_" + n.Authority }

// RolloutsBucket holds the fleet upgrades' progress (RolloutRecord).
func (n Names) RolloutsBucket() string { return "cp_rollouts_" + n.Authority }

// CanaryDecisionsBucket holds operators' promote and abort decisions on
// canaries under way (CanaryDecision); control role only.
func (n Names) CanaryDecisionsBucket() string { return "cp_canary_decisions_" + n.Authority }

// CanaryKeysBucket holds the key of the canary bucket cookie's MAC
// (CanaryCookieKey): written by the control plane, read by gateways.
func (n Names) CanaryKeysBucket() string { return "cp_canary_keys_" + n.Authority }

// MetaBucket holds what the store says of its readers: the floor
// (StoreFloor, the lowest schema generation a process must be at) and
// each control server's announcement (ServerRecord). Control servers
// write it; every role reads the floor.
func (n Names) MetaBucket() string { return "cp_meta_" + n.Authority }

// ReleaseBinariesStore is the object store of the releases' binaries.
func (n Names) ReleaseBinariesStore() string { return "cp_release_bins_" + n.Authority }

// ObservationBuckets hold live observations (gateway progress, heartbeats,
// drift reports): never truth, rebuilt by their writers, so never carried
// from one store to another.
func (n Names) ObservationBuckets() []string {
	return []string{n.GatewaysBucket(), n.GatewayTrafficBucket(), n.MeshHeartbeatsBucket(), n.MeshDriftBucket(), n.MachineStatesBucket(), n.MachineBeatsBucket(), n.FleetStatusBucket(), n.MachineLivenessBucket()}
}

// Subjects.

func (n Names) subjectPrefix() string { return "cp." + n.Authority }

// DeployCommitSubject is where commits of kind ("checkpoint" or "final") for
// namespace ns are appended.
func (n Names) DeployCommitSubject(ns string, kind CommitKind) string {
	return n.subjectPrefix() + ".commits." + ns + "." + string(kind)
}

// DeployCommitsWildcard matches every commit subject.
func (n Names) DeployCommitsWildcard() string { return n.subjectPrefix() + ".commits.>" }

// RoutingServiceSubject is the subject of routing events for one service.
func (n Names) RoutingServiceSubject(ns, service string) string {
	return n.subjectPrefix() + ".routing.svc." + ns + "." + service
}

// RoutingMachineSubject is the subject of routing events for one machine.
func (n Names) RoutingMachineSubject(machine string) string {
	return n.subjectPrefix() + ".routing.machine." + machine
}

// RoutingRegionSubject is the subject of routing events for one region's
// state.
func (n Names) RoutingRegionSubject(region string) string {
	return n.subjectPrefix() + ".routing.region." + region
}

// RoutingRegionOf says which region a routing event subject is of, if it
// is a region's.
func (n Names) RoutingRegionOf(subject string) (string, bool) {
	r, ok := strings.CutPrefix(subject, n.subjectPrefix()+".routing.region.")
	return r, ok && ValidToken(r)
}

// RoutingBatchSubject is where part i of a namespace's routing batch is
// filed (routingbatch.go): a commit's or canary step's events for the
// namespace, many per message.
func (n Names) RoutingBatchSubject(ns string, part int) string {
	return n.subjectPrefix() + ".routing.ns." + ns + "." + strconv.Itoa(part)
}

// RoutingBatchOf says which namespace and part a routing batch subject is
// of, if it is one.
func (n Names) RoutingBatchOf(subject string) (ns string, part int, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.subjectPrefix()+".routing.ns.")
	if !ok {
		return "", 0, false
	}
	ns, idx, ok := strings.Cut(rest, ".")
	if !ok || !ValidToken(ns) {
		return "", 0, false
	}
	part, err := strconv.Atoi(idx)
	if err != nil || part < 0 || strconv.Itoa(part) != idx {
		return "", 0, false
	}
	return ns, part, true
}

// RoutingBatchWildcard matches every part subject of namespace ns's
// routing batches.
func (n Names) RoutingBatchWildcard(ns string) string {
	return n.subjectPrefix() + ".routing.ns." + ns + ".*"
}

// RoutingSealSubject is where the control plane files the seal that
// vouches for the batch of routing events right after it (seal.go). It is
// in the routing stream, under RoutingWildcard, but no service's or
// machine's subject.
func (n Names) RoutingSealSubject() string { return n.subjectPrefix() + ".routing.seal" }

// RoutingSubjectOf says what a routing event subject is of: a service
// (namespace and service) or a machine (machine, namespace "").
func (n Names) RoutingSubjectOf(subject string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.subjectPrefix()+".routing.")
	if !ok {
		return "", "", false
	}
	if m, ok := strings.CutPrefix(rest, "machine."); ok && ValidToken(m) {
		return "", m, true
	}
	if svc, ok := strings.CutPrefix(rest, "svc."); ok {
		ns, name, ok := strings.Cut(svc, ".")
		return ns, name, ok && ns != "" && name != ""
	}
	return "", "", false
}

// RoutingWildcard matches every routing event subject.
func (n Names) RoutingWildcard() string { return n.subjectPrefix() + ".routing.>" }

// RoutingRepublishedWildcard is where the routing stream republishes each
// event once stored, with its sequence: what projections follow, since no
// untrusted role may have a consumer.
func (n Names) RoutingRepublishedWildcard() string { return "rp." + n.RoutingWildcard() }

// MeshPeersRepublishedWildcard is where the mesh peers bucket republishes
// each change once stored: what meshd follows.
func (n Names) MeshPeersRepublishedWildcard() string { return "rp.kv." + n.MeshPeersBucket() + ".>" }

// SignersRepublishedWildcard is where the signers bucket's writes are
// republished, so readers learn of a new or retired signer at once.
func (n Names) SignersRepublishedWildcard() string { return "rp.kv." + n.SignersBucket() + ".>" }

// MachineLivenessRepublishedWildcard is where the machine liveness bucket
// republishes each judgement once stored: what gateways follow to set
// aside the instances of a machine that stopped beating.
func (n Names) MachineLivenessRepublishedWildcard() string {
	return "rp.kv." + n.MachineLivenessBucket() + ".>"
}

// FleetStatusFlushedSubject is where the fleet status aggregator says,
// after each flush, which writes every summary counts
// (FleetStatusFlushed).
func (n Names) FleetStatusFlushedSubject() string { return n.subjectPrefix() + ".fleet.flushed" }

// CertRenewalSubject is where renewal work for host is scheduled.
func (n Names) CertRenewalSubject(host string) string {
	return n.subjectPrefix() + ".certs.renew." + KeySafe(host)
}

// CertRenewalScheduleSubject holds the schedule definition for host; the
// server places generated work on CertRenewalSubject.
func (n Names) CertRenewalScheduleSubject(host string) string {
	return n.subjectPrefix() + ".certs.schedule." + KeySafe(host)
}

// CertRenewalWorkFilter matches every host's renewal work items (not their
// schedules).
func (n Names) CertRenewalWorkFilter() string { return n.subjectPrefix() + ".certs.renew.>" }

// CertRenewalsWildcard matches both renewal subjects.
func (n Names) CertRenewalsWildcard() string { return n.subjectPrefix() + ".certs.>" }

// RPCSubject addresses command on machine.
func (n Names) RPCSubject(machine, command string) string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".rpc.node." + machine + "." + command
}

// NodeListenSubject is the wildcard an agent for machine listens on: every
// authority's commands for that machine.
func (n Names) NodeListenSubject(machine string) string {
	return "edgeplane.v1." + n.Installation + ".*.rpc.node." + machine + ".>"
}

// NodeQueueGroup is the queue group of machine's listeners, so a second agent
// process for the same machine never runs a command twice.
func (n Names) NodeQueueGroup(machine string) string { return "node." + machine }

// AdmissionSubject is where machine's agent asks the control plane for
// verb ("join" with an invite, "address" to move): the control plane writes
// machine records, never an agent. The machine token lets credentials bind
// an agent to its own subject.
func (n Names) AdmissionSubject(verb, machine string) string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".rpc.admission." + verb + "." + machine
}

// CredsSubject is where a box asks the control plane about its own
// credentials: verb "renew" (a JWT for a new key of its own) or "retire"
// (revoke the key it renewed from). role and id (CredsSubjectID of the
// machine or gateway name) let credentials bind a box to its own subject.
func (n Names) CredsSubject(verb, role, id string) string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".rpc.creds." + verb + "." + role + "." + id
}

// CredsSubjectID is the subject token of a machine ID or gateway name: one
// token, whatever the name holds.
func CredsSubjectID(machine string) string { return SubjectToken(machine) }

// SubjectToken is s as one subject token: KeySafe, with its dots escaped
// too.
func SubjectToken(s string) string { return strings.ReplaceAll(KeySafe(s), ".", "_2e") }

// RegistrarSubject is where meshd registers with the control plane.
func (n Names) RegistrarSubject(command string) string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".rpc.registrar." + command
}

// RoutingRepublishSubject is where machine's agent asks the control plane to
// republish a service's routing. The machine token lets credentials bind an
// agent to its own subject.
func (n Names) RoutingRepublishSubject(machine string) string {
	return n.routingRepublishPrefix() + "." + machine
}

// RoutingRepublishWildcard matches every machine's RoutingRepublishSubject.
func (n Names) RoutingRepublishWildcard() string { return n.routingRepublishPrefix() + ".*" }

func (n Names) routingRepublishPrefix() string {
	return "edgeplane.v1." + n.Installation + "." + n.Authority + ".rpc.routing.republish"
}

// Lock keys (in LocksBucket).

// DeployLocksFilter matches every namespace's DeployLockKey.
const DeployLocksFilter = "cp.lock.deploy.*"

func DeployLockKey(namespace string) string { return "cp.lock.deploy." + KeySafe(namespace) }
func CertLockKey(hostname string) string    { return "cp.lock.cert." + KeySafe(hostname) }
func AcmeAccountLockKey(issuerURL string) string {
	return "cp.lock.acme_account." + KeySafe(issuerURL)
}
func SubnetLockKey(subnet string) string { return "cp.lock.subnet." + KeySafe(subnet) }

// FleetStatusLockKey is held by the one control server whose aggregator
// writes the fleet status; the others stand by.
const FleetStatusLockKey = "cp.lock.fleet_status"

// KeySafe encodes s reversibly into characters a KV key and a subject token
// sequence accept. Letters, digits, '-' and '.' pass through (a '.' that would
// leave an empty token is escaped); every other byte, including '_', becomes
// "_xx" in lower-case hex. DecodeKeySafe reverses it.
func KeySafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		case c == '.' && i > 0 && i < len(s)-1 && s[i-1] != '.' && s[i+1] != '.':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return b.String()
}

// DecodeKeySafe reverses KeySafe.
func DecodeKeySafe(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '_' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("decoding key %q: truncated escape at %d", s, i)
		}
		var c byte
		if _, err := fmt.Sscanf(s[i+1:i+3], "%02x", &c); err != nil {
			return "", fmt.Errorf("decoding key %q: bad escape at %d", s, i)
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}
