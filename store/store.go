package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// DefaultURL is the NATS URL clients use unless told otherwise.
const DefaultURL = "nats://127.0.0.1:4222"

// URLFromEnv returns $EDGEPLANE_NATS, else DefaultURL.
func URLFromEnv() string {
	if u := os.Getenv("EDGEPLANE_NATS"); u != "" {
		return u
	}
	return DefaultURL
}

// defaultConnectTimeout bounds a connect, and Dial's binding, unless told
// otherwise.
const defaultConnectTimeout = 5 * time.Second

// ConnectOptions says how to reach NATS.
type ConnectOptions struct {
	URL       string
	CredsFile string
	// CAFile is a PEM bundle of the CAs storage nodes are verified
	// against; default: the bundle the credentials file carries. With
	// either, the connection is TLS from the first byte; with neither, it
	// is plaintext (a loopback store without credentials).
	CAFile string
	// Name identifies the connection in server monitoring.
	Name string
	// OwnServer says URL is this process's own embedded server (a
	// storage node's own connection): plaintext to it never leaves the
	// box, whatever address it listens on. Every other client with
	// credentials refuses plaintext to a server off loopback.
	OwnServer bool
	// Timeout bounds the initial connect; default 5s.
	Timeout time.Duration
	// ReconnectForever keeps reconnecting after the server goes away
	// (long-running processes); clients that run one command fail instead.
	ReconnectForever bool
	// ReconnectDelay, with ReconnectForever, is the wait before reconnect
	// attempt n (1-based); default ReconnectBackoff.
	ReconnectDelay func(attempt int) time.Duration
	// Handlers observe connection state changes; any may be nil.
	OnDisconnect func(error)
	OnReconnect  func()
	// OnClosed is told when the connection is closed for good: by Close,
	// or by the client giving up (its credentials refused on reconnect).
	OnClosed func()
}

// ReconnectBackoff is the default wait before reconnect attempt n of a
// long-running process: a uniformly random time within a window of one
// second, two from the second attempt on. Every edge box loses its
// connection when a storage node restarts; spread over the window they
// come back over seconds instead of in the same instant, and none waits
// more than two seconds once the node is back.
func ReconnectBackoff(attempt int) time.Duration {
	window := time.Second << min(max(attempt-1, 0), 1)
	return time.Duration(rand.Int64N(int64(window)))
}

// ErrNoFleetCA is returned by Connect for a tls:// server when neither the
// credentials nor a CA file carry the fleet CA to verify it against: a
// caller names its own flags in what it tells the user.
var ErrNoFleetCA = errors.New("the server asks for TLS but no fleet CA was given")

// Connect dials NATS.
func Connect(o ConnectOptions) (*nats.Conn, error) {
	url := o.URL
	if url == "" {
		url = DefaultURL
	}
	timeout := cmp.Or(o.Timeout, defaultConnectTimeout)
	opts := []nats.Option{nats.Name(o.Name), nats.Timeout(timeout)}
	var held *credsHolder
	if o.CredsFile != "" {
		co, h, err := credsOptions(o.CredsFile)
		if err != nil {
			return nil, &Error{Code: CodeInvalid, Message: err.Error(), Detail: map[string]string{"creds": o.CredsFile}}
		}
		opts, held = append(opts, co...), h
	}
	caSource := cmp.Or(o.CAFile, o.CredsFile)
	var t *trust
	if caSource != "" {
		var err error
		if t, err = loadTrust(caSource); err != nil {
			return nil, Errorf(CodeInvalid, "fleet CA: %w", err).With("ca", caSource)
		}
		if t == nil && o.CAFile != "" {
			return nil, Errorf(CodeInvalid, "fleet CA: %s holds no certificate", o.CAFile).With("ca", o.CAFile)
		}
	}
	if t != nil {
		opts = append(opts, tlsOptions(t)...)
	} else if strings.Contains(url, "tls://") {
		return nil, Errorf(CodeInvalid, "%s: %w: credentials from `control creds issue` carry it, or give a CA file", redactURL(url), ErrNoFleetCA).
			With("url", redactURL(url))
	} else if (o.CredsFile != "" || hasURLSecret(url)) && !o.OwnServer && !LoopbackURLs(url) && !allSecureURLs(url) {
		// A credential sent in the clear to another box proves who we
		// are to anyone on the path, and a server we cannot verify may be
		// anyone's: credentials leave this box over TLS only.
		return nil, Errorf(CodePlaintextRefused, "%s is not on this box and the connection would be plaintext: credentials are sent to another box over TLS only; "+
			"give the fleet CA (credentials from `control creds issue` carry it; else --tls-ca FILE, a CA bundle from `control tls ca`) and use a tls:// URL", redactURL(url)).
			With("url", redactURL(url)).With("creds", o.CredsFile).With("hint", "a CA bundle (--tls-ca) or credentials carrying the fleet CA")
	}
	if o.ReconnectForever {
		delay := o.ReconnectDelay
		if delay == nil {
			delay = ReconnectBackoff
		}
		opts = append(opts, nats.MaxReconnects(-1), nats.CustomReconnectDelay(delay), nats.RetryOnFailedConnect(false))
	}
	if o.OnDisconnect != nil {
		opts = append(opts, nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { o.OnDisconnect(err) }))
	}
	if o.OnReconnect != nil {
		opts = append(opts, nats.ReconnectHandler(func(*nats.Conn) { o.OnReconnect() }))
	}
	opts = append(opts, nats.ClosedHandler(func(nc *nats.Conn) {
		holders.Delete(nc)
		if o.OnClosed != nil {
			o.OnClosed()
		}
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil && held != nil && held.expiredErr() != nil {
		return nil, held.expiredErr()
	}
	if err != nil {
		if terr := tlsError(url, err, t != nil, caSource); terr != nil {
			return nil, terr
		}
		hint := "is `control server` running? set --nats or $EDGEPLANE_NATS"
		if t == nil && !LoopbackURLs(url) {
			hint += "; a storage node with credentials speaks TLS only: credentials issued by it carry the fleet CA"
		}
		return nil, &Error{Code: CodeUnavailable, Message: fmt.Sprintf("connecting to NATS at %s: %v", redactURL(url), err),
			Detail: map[string]string{"url": redactURL(url), "hint": hint}}
	}
	if held != nil {
		held.opts = ConnectOptions{URL: o.URL, CredsFile: o.CredsFile, CAFile: o.CAFile, Name: o.Name, Timeout: o.Timeout}
		holders.Store(nc, held)
	}
	return nc, nil
}

// Layout tunes how streams and buckets are created.
type Layout struct {
	// Replicas for every stream and bucket; default 1. A cluster of three
	// storage nodes uses 3.
	Replicas int
}

// Store is an open connection to the control-plane store: every stream and
// bucket of one authority.
type Store struct {
	NC    *nats.Conn
	JS    jetstream.JetStream
	Names Names

	commits  jetstream.Stream
	routing  jetstream.Stream
	renewals jetstream.Stream
	// accessLogs keeps the last hour of sampled access lines.
	accessLogs jetstream.Stream
	status     jetstream.KeyValue
	phases     jetstream.KeyValue
	instances  jetstream.KeyValue
	machines   jetstream.KeyValue
	locks      jetstream.KeyValue
	invites    jetstream.KeyValue
	certs      jetstream.KeyValue
	certStatus jetstream.KeyValue
	acmeBudget jetstream.KeyValue
	meshPeers  jetstream.KeyValue
	meshBeats  jetstream.KeyValue
	meshIPs    jetstream.KeyValue
	meshDrift  jetstream.KeyValue
	// meshKeys holds the mesh's secrets (MeshPSKSecretKey).
	meshKeys jetstream.KeyValue
	gateways jetstream.KeyValue
	// gatewayTraffic holds each gateway's traffic counters
	// (gatewayTraffic), an observation aging out like Gateways.
	gatewayTraffic jetstream.KeyValue
	// dashboardTokens holds the dashboard's login tokens, hashed.
	dashboardTokens jetstream.KeyValue
	// dashboardSessions holds the dashboard's logins under way, each
	// expiring with its own TTL.
	dashboardSessions jetstream.KeyValue
	// releases holds the signed release records; their binaries are in
	// the object store ReleaseBinariesStore.
	releases jetstream.KeyValue
	// rollouts holds the progress of fleet upgrades.
	rollouts jetstream.KeyValue
	// canaryDecisions holds operators' decisions on canaries under way.
	canaryDecisions jetstream.KeyValue
	// canaryKeys holds the key gateways sign canary bucket cookies with
	// (CanaryCookieKey); the control plane writes it, gateways read it.
	canaryKeys jetstream.KeyValue
	// revocations lists refused credentials (RevokeUser); control role only.
	revocations jetstream.KeyValue
	// credentials records every user key issued to a box
	// (CredentialRecord); control role only.
	credentials jetstream.KeyValue

	// signers holds the signer certificates and the trust root's record.
	signers jetstream.KeyValue
	// hosts says which namespace owns each routed host (HostClaim).
	hosts jetstream.KeyValue
	// machineStates and machineBeats are what agents observe of their
	// machines (MachineState, MachineBeat).
	machineStates jetstream.KeyValue
	machineBeats  jetstream.KeyValue
	// observed holds what each machine's agent last saw of its instances
	// (MachineObserved), newer than their records when it is.
	observed jetstream.KeyValue
	// machineLiveness is the aggregator's judgement of which machines
	// stopped beating, what gateways set aside by.
	machineLiveness jetstream.KeyValue
	// fleetStatus holds each namespace's summary (NamespaceStatus).
	fleetStatus jetstream.KeyValue
	// meta holds the store's floor and the control servers'
	// announcements (generation.go).
	meta jetstream.KeyValue

	// apiPrefix is where this connection reaches the JetStream API, with
	// its trailing dot (see EdgeAPIPrefix).
	apiPrefix string

	// signer signs appended intent; nil in a process that writes none.
	signer Signer
	// trust verifies what s reads.
	trust trustState
	// heads caches the last sequence of each stream s appends signed
	// messages to.
	heads struct {
		mu   sync.Mutex
		last map[string]uint64
	}

	// clustered is set when the storage nodes form a JetStream cluster
	// (then, and only then, operations ride out leader elections for up to
	// electionWait).
	clustered    bool
	electionWait time.Duration
	log          *zap.Logger
}

// RoutingHistory is how many events of each routing subject (a service, a
// machine) the routing stream keeps: the last is the state, the others are
// for people reading what changed.
const RoutingHistory = 4

// RenewalsConsumer is the durable pull consumer on the renewals stream that
// every gateway takes renewal work from, so each item is worked once.
// Gateways may not create consumers: the control plane provisions it.
const RenewalsConsumer = "cert_renewals"

// RenewalsAckWait is how long a renewal item may go without its worker
// reporting progress before another gateway gets it.
const RenewalsAckWait = 2 * time.Minute

// GatewayObservationTTL is how long a gateway's report lives without refresh.
const GatewayObservationTTL = 15 * time.Second

// streamSpec and bucketSpec are one stream or bucket of the layout and the
// Store field it binds to.
type streamSpec struct {
	dst *jetstream.Stream
	cfg jetstream.StreamConfig
}

type bucketSpec struct {
	dst *jetstream.KeyValue
	cfg jetstream.KeyValueConfig
	// keyTTLs lets writers give a key its own TTL (leases, invites).
	keyTTLs bool
}

// MaxCertValue is the largest value the certificates bucket holds: a
// certificate chain, key or ACME record is a few KiB.
const MaxCertValue = 1 << 20

// Size units for the layout's limits.
const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// layout is every stream and bucket of s's authority, in one place for
// Provision, Open and StreamNames. Replicas are left for Provision to set.
//
// Every stream and bucket has a size limit and a largest message, so that
// no writer, however compromised, fills the storage nodes' disks: a write
// past a limit is refused (storage_full) and nothing already stored is
// dropped to make room (discard new), except the observations that age out
// by design and the events a routing subject's newer events replace.
func (s *Store) layout() ([]streamSpec, []bucketSpec) {
	names := s.Names
	streams := []streamSpec{
		{&s.commits, jetstream.StreamConfig{
			Name: names.DeployCommitsStream(), Subjects: []string{names.DeployCommitsWildcard()},
			Description: "immutable deploy commits (durable intent)",
			DenyDelete:  true, DenyPurge: true, Duplicates: 10 * time.Minute,
			MaxBytes: 8 * gib, MaxMsgSize: 4 * mib, Discard: jetstream.DiscardNew, AllowDirect: true,
		}},
		{&s.routing, jetstream.StreamConfig{
			Name: names.RoutingEventsStream(), Subjects: []string{names.RoutingWildcard()},
			Description: "ordered routing events the gateway and DNS projections consume",
			// The last events of every subject are the routing state a
			// cold start reads (LoadRouting): nothing goes by age, a
			// subject keeps its few latest events.
			MaxMsgsPerSubject: RoutingHistory, Duplicates: 10 * time.Minute, Discard: jetstream.DiscardNew,
			DenyDelete: true, DenyPurge: true, MaxBytes: 2 * gib, MaxMsgSize: 4 * mib, AllowDirect: true,
			RePublish: &jetstream.RePublish{Source: names.RoutingWildcard(), Destination: names.RoutingRepublishedWildcard()},
		}},
		{&s.renewals, jetstream.StreamConfig{
			Name: names.CertRenewalsStream(), Subjects: []string{names.CertRenewalsWildcard()},
			Description:       "scheduled certificate renewal work",
			AllowMsgSchedules: true, AllowMsgTTL: true,
			// Schedules cannot discard new; at the limit the oldest item
			// goes, and its host is renewed by certmagic's own check.
			DenyPurge: true, MaxBytes: 256 * mib, MaxMsgSize: 4 * kib,
		}},
		{&s.accessLogs, jetstream.StreamConfig{
			Name: names.AccessLogsStream(), Subjects: []string{names.AccessLogsWildcard()},
			Description: "the last hour of the access lines gateways publish (sampled)",
			// Lines age out, and at the size limit the oldest go: a busy
			// fleet keeps less than an hour rather than refusing the
			// newest. Gateways publish them as core NATS messages, so a
			// line costs the request no store round trip.
			MaxAge: time.Hour, MaxBytes: 1 * gib, MaxMsgSize: 16 * kib, Discard: jetstream.DiscardOld,
			DenyDelete: true, DenyPurge: true,
		}},
	}
	bucket := func(dst *jetstream.KeyValue, name string, history uint8, maxBytes int64, maxValue int32) bucketSpec {
		return bucketSpec{dst: dst, cfg: jetstream.KeyValueConfig{Bucket: name, History: history, MaxBytes: maxBytes, MaxValueSize: maxValue}}
	}
	buckets := []bucketSpec{
		bucket(&s.certs, names.CertsBucket(), 1, 4*gib, MaxCertValue),
		bucket(&s.status, names.DeployStatusBucket(), 1, 1*gib, 1*mib),
		bucket(&s.phases, names.DeployPhasesBucket(), 1, 256*mib, 16*kib),
		bucket(&s.instances, names.InstancesBucket(), 1, 1*gib, 16*kib),
		bucket(&s.machines, names.MachinesBucket(), 5, 256*mib, 16*kib),
		bucket(&s.locks, names.LocksBucket(), 1, 64*mib, 4*kib),
		bucket(&s.invites, names.InvitesBucket(), 1, 64*mib, 4*kib),
		bucket(&s.certStatus, names.CertStatusBucket(), 1, 256*mib, 16*kib),
		bucket(&s.acmeBudget, names.AcmeBudgetBucket(), 1, 64*mib, 64*kib),
		bucket(&s.meshPeers, names.MeshPeersBucket(), 5, 256*mib, 16*kib),
		bucket(&s.meshBeats, names.MeshHeartbeatsBucket(), 1, 256*mib, 4*kib),
		bucket(&s.meshIPs, names.MeshIPsBucket(), 1, 64*mib, 4*kib),
		bucket(&s.meshDrift, names.MeshDriftBucket(), 1, 256*mib, 64*kib),
		bucket(&s.meshKeys, names.MeshKeysBucket(), 1, 8*mib, 4*kib),
		bucket(&s.gateways, names.GatewaysBucket(), 1, 64*mib, 4*kib),
		bucket(&s.gatewayTraffic, names.GatewayTrafficBucket(), 1, 256*mib, 1*mib),
		bucket(&s.dashboardTokens, names.DashboardTokensBucket(), 1, 8*mib, 4*kib),
		bucket(&s.dashboardSessions, names.DashboardSessionsBucket(), 1, 16*mib, 4*kib),
		bucket(&s.releases, names.ReleasesBucket(), 1, 16*mib, 16*kib),
		bucket(&s.rollouts, names.RolloutsBucket(), 1, 64*mib, 16*kib),
		bucket(&s.canaryDecisions, names.CanaryDecisionsBucket(), 1, 16*mib, 4*kib),
		bucket(&s.canaryKeys, names.CanaryKeysBucket(), 1, 1*mib, 1*kib),
		bucket(&s.revocations, names.RevocationsBucket(), 1, 64*mib, 4*kib),
		bucket(&s.credentials, names.CredentialsBucket(), 1, 256*mib, 4*kib),
		bucket(&s.signers, names.SignersBucket(), 5, 64*mib, 4*kib),
		bucket(&s.hosts, names.HostsBucket(), 1, 256*mib, 4*kib),
		bucket(&s.machineStates, names.MachineStatesBucket(), 1, 256*mib, 4*kib),
		// A machine's observations name every instance it runs (up to a
		// few hundred, ~200 bytes each).
		bucket(&s.observed, names.ObservedBucket(), 1, 1*gib, 1*mib),
		bucket(&s.machineBeats, names.MachineBeatsBucket(), 1, 64*mib, 4*kib),
		bucket(&s.machineLiveness, names.MachineLivenessBucket(), 1, 64*mib, 2*mib),
		bucket(&s.fleetStatus, names.FleetStatusBucket(), 1, 256*mib, 256*kib),
		bucket(&s.meta, names.MetaBucket(), 1, 16*mib, 4*kib),
	}
	for i := range buckets {
		switch buckets[i].dst {
		case &s.locks, &s.invites, &s.acmeBudget, &s.meshIPs, &s.dashboardSessions:
			buckets[i].keyTTLs = true
		case &s.gateways, &s.gatewayTraffic:
			buckets[i].cfg.TTL = GatewayObservationTTL
		case &s.meshPeers:
			buckets[i].cfg.RePublish = &jetstream.RePublish{
				Source: "$KV." + names.MeshPeersBucket() + ".>", Destination: names.MeshPeersRepublishedWildcard()}
		case &s.signers:
			buckets[i].cfg.RePublish = &jetstream.RePublish{
				Source: "$KV." + names.SignersBucket() + ".>", Destination: names.SignersRepublishedWildcard()}
		// Heartbeats are not republished: gateways follow the liveness
		// judgement instead (since v0.37.0), and a republish nobody
		// subscribes to still cost the storage node a message per beat.
		case &s.machineLiveness:
			buckets[i].cfg.RePublish = &jetstream.RePublish{
				Source: "$KV." + names.MachineLivenessBucket() + ".>", Destination: names.MachineLivenessRepublishedWildcard()}
		}
	}
	return streams, buckets
}

// RenewalsConsumerConfig is the renewal consumer's definition: pull, one
// item per host worked at a time across the fleet.
func RenewalsConsumerConfig(names Names) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       RenewalsConsumer,
		Description:   "gateways taking certificate renewal work",
		FilterSubject: names.CertRenewalWorkFilter(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       RenewalsAckWait,
		MaxAckPending: 64,
	}
}

// bucketStream is the stream a KV bucket lives in: nats.go's own mapping,
// except that no message may roll the bucket up and the stream refuses
// purges. With rollups allowed, permission to write one key would be
// permission to wipe the whole bucket (a "Nats-Rollup: all" header). Keys
// with their own TTL (keyTTLs) expire without leaving a delete marker:
// markers are rollups, and nothing here watches for them.
func bucketStream(cfg jetstream.KeyValueConfig, keyTTLs bool) jetstream.StreamConfig {
	dupes := 2 * time.Minute
	if cfg.TTL > 0 && cfg.TTL < dupes {
		dupes = cfg.TTL
	}
	sc := jetstream.StreamConfig{
		Name: "KV_" + cfg.Bucket, Subjects: []string{"$KV." + cfg.Bucket + ".>"}, Description: cfg.Description,
		MaxMsgsPerSubject: int64(max(cfg.History, 1)), MaxBytes: cfg.MaxBytes, MaxAge: cfg.TTL, MaxMsgSize: cfg.MaxValueSize,
		Replicas: cfg.Replicas, MaxMsgs: -1, MaxConsumers: -1, Duplicates: dupes,
		AllowRollup: false, DenyDelete: true, DenyPurge: true, AllowDirect: true, Discard: jetstream.DiscardNew,
		RePublish: cfg.RePublish,
	}
	sc.AllowMsgTTL = keyTTLs
	return sc
}

// Provision creates (or updates to the current definition) every stream and
// bucket, then opens them. It is idempotent and safe to run from every server
// at start.
func Provision(ctx context.Context, nc *nats.Conn, names Names, layout Layout) (*Store, error) {
	s, err := newStore(nc, names)
	if err != nil {
		return nil, err
	}
	r := layout.Replicas
	if r == 0 {
		r = 1
	}
	streams, buckets := s.layout()
	for _, st := range streams {
		d := s.durabilityOf(st.dst)
		if d == "" {
			return nil, fmt.Errorf("provisioning stream %s: its durability is not classified (store/durability.go)", st.cfg.Name)
		}
		st.cfg.Replicas = r
		st.cfg.PersistMode = persistMode(d, s.clustered, r)
		str, err := createOrUpdateStream(ctx, s.JS, st.cfg)
		if err != nil {
			return nil, classify(fmt.Errorf("provisioning stream %s: %w", st.cfg.Name, err))
		}
		*st.dst = s.electedStream(str)
	}
	if _, err := s.renewals.CreateOrUpdateConsumer(ctx, RenewalsConsumerConfig(names)); err != nil {
		return nil, classify(fmt.Errorf("provisioning the renewal consumer: %w", err))
	}
	for _, b := range buckets {
		d := s.durabilityOf(b.dst)
		if d == "" {
			return nil, fmt.Errorf("provisioning bucket %s: its durability is not classified (store/durability.go)", b.cfg.Bucket)
		}
		b.cfg.Replicas = r
		sc := bucketStream(b.cfg, b.keyTTLs)
		sc.PersistMode = persistMode(d, s.clustered, r)
		if _, err := createOrUpdateStream(ctx, s.JS, sc); err != nil {
			return nil, classify(fmt.Errorf("provisioning bucket %s: %w", b.cfg.Bucket, err))
		}
		kv, err := s.JS.KeyValue(ctx, b.cfg.Bucket)
		if err != nil {
			return nil, classify(fmt.Errorf("opening bucket %s: %w", b.cfg.Bucket, err))
		}
		*b.dst = kv
	}
	// The releases' binaries: written by control clients, read by direct
	// gets (FetchReleaseBinary), so Open does not bind it.
	if _, err := s.JS.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: names.ReleaseBinariesStore(), Description: "the fleet's own binaries, per release and architecture",
		Replicas: r, MaxBytes: ReleaseStoreMaxBytes,
	}); err != nil {
		return nil, classify(fmt.Errorf("provisioning the release object store: %w", err))
	}
	if _, err := s.EnsureCanaryCookieKey(ctx); err != nil {
		return nil, fmt.Errorf("provisioning the canary cookie key: %w", err)
	}
	return s, nil
}

// ReservedBytes is what JetStream must let one authority's store hold for
// Provision to create it: the size limits of its streams, buckets and
// release object store added up (JetStream reserves each limit whole when
// the stream is created).
func ReservedBytes() int64 {
	streams, buckets := (&Store{}).layout()
	n := int64(ReleaseStoreMaxBytes)
	for _, st := range streams {
		n += st.cfg.MaxBytes
	}
	for _, b := range buckets {
		n += b.cfg.MaxBytes
	}
	return n
}

// ReleaseStoreMaxBytes bounds the release object store: about forty
// releases of three ~50 MB binaries for two architectures.
const ReleaseStoreMaxBytes = 16 * gib

// Open returns the store of names' authority on nc, whose streams and
// buckets a server provisioned. It asks the server nothing: each stream and
// bucket is bound when first used, and using one that is missing fails
// then, with a clear error. ctx is unused; it is kept for callers that
// bound an open.
func Open(ctx context.Context, nc *nats.Conn, names Names) (*Store, error) {
	s, err := newStore(nc, names)
	if err != nil {
		return nil, err
	}
	// Each binds when first used (lazy.go): a process asks for the info
	// of what it uses only, and an agent's gets and puts for none.
	streams, buckets := s.layout()
	for _, st := range streams {
		*st.dst = &lazyStream{s: s, name: st.cfg.Name}
	}
	for _, b := range buckets {
		*b.dst = &lazyKV{s: s, name: b.cfg.Bucket}
	}
	return s, nil
}

// Bind is Open, then binds every stream and bucket at once: for a process
// that waits until a server has provisioned the authority (a storage node
// joining a cluster, a client of one), which fails while one is missing.
func Bind(ctx context.Context, nc *nats.Conn, names Names) (*Store, error) {
	s, err := Open(ctx, nc, names)
	if err != nil {
		return nil, err
	}
	streams, buckets := s.layout()
	for _, st := range streams {
		if _, err := (*st.dst).(*lazyStream).bind(ctx); err != nil {
			return nil, err
		}
	}
	for _, b := range buckets {
		if _, err := (*b.dst).(*lazyKV).bind(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// bindTimeout bounds binding a stream where no context does.
const bindTimeout = defaultConnectTimeout

func newStore(nc *nats.Conn, names Names) (*Store, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	s := &Store{NC: nc, Names: names, apiPrefix: apiPrefixOf(nc),
		clustered: nc.ConnectedClusterName() != "", electionWait: ElectionWait}
	s.JS = electedJS{JetStream: js, s: s}
	return s, nil
}

// newJetStream is nc's JetStream API, under the prefix its credentials
// reach it by (apiPrefixOf).
func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.NewWithAPIPrefix(nc, strings.TrimSuffix(apiPrefixOf(nc), "."))
	if err != nil {
		return nil, fmt.Errorf("opening jetstream: %w", err)
	}
	return js, nil
}

// classify turns transport-level JetStream failures into structured errors so
// that a caller sees "unavailable" rather than a library message.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case storageFull(apiErr):
			return &Error{Code: CodeStorageFull, Message: err.Error() + "; the store refuses new writes until space is freed (see `control storage ls`)"}
		case apiErr.ErrorCode == 10054: // message size exceeds maximum allowed
			return &Error{Code: CodeInvalid, Message: err.Error()}
		}
	}
	if leaderUnreachable(err) {
		return &Error{Code: CodeQuorumUnavailable, Message: err.Error() + "; storage nodes are missing (see `control storage ls`)"}
	}
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return &Error{Code: CodeUnavailable, Message: err.Error()}
	}
	return err
}

// PullFresh runs a pull from a consumer created just before (Fetch, Next)
// again while JetStream answers "no responders", for up to 5s. In a
// cluster the consumer's pull subscription lives on the server that hosts
// it, while the answer to its creation can come from another (the meta
// leader) and reach us before that subscription's interest does.
func PullFresh[T any](ctx context.Context, pull func() (T, error)) (T, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := pull()
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// storageFull reports whether JetStream refused a write for want of room:
// a stream or bucket at its byte or message limit (discard new), or no
// storage left on the node or in the account.
func storageFull(e *jetstream.APIError) bool {
	switch e.ErrorCode {
	case 10047, 10023, 10002: // insufficient storage, insufficient resources, account limits
		return true
	case 10077: // store failed: {err}
		return strings.Contains(e.Description, "maximum bytes") || strings.Contains(e.Description, "maximum messages")
	}
	return false
}

// leaderUnreachable reports whether err is JetStream saying its cluster is
// not available or a stream is offline: no RAFT leader can be reached, so
// nothing can be committed.
func leaderUnreachable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == 10008 || apiErr.ErrorCode == 10118 || apiErr.Code == 503)
}

// Classify is classify for other packages: JetStream transport failures
// become a structured "unavailable" error; anything else passes through.
func Classify(err error) error { return classify(err) }
