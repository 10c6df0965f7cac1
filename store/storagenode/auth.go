package storagenode

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/store"
)

// Role-scoped credentials. A storage node runs its embedded server in NATS
// operator mode: one operator, an application account that holds every
// stream and bucket, and a system account. A credentials file is a user JWT
// signed by the application account plus the user's nkey seed; the JWT
// carries the role's subject permissions, so any storage node accepts it
// without a user list, and issuing one needs the account key that only
// storage nodes hold (the auth dir, part of the store trust boundary).

// Roles credentials are issued for.
const (
	// RoleControl is the storage nodes' control servers and operators' CLI:
	// everything.
	RoleControl = "control"
	// RoleGateway is the custom Caddy (gateway, DNS, certificate storage):
	// reads routing state, reads and writes certificates.
	RoleGateway = "gateway"
	// RoleAgent is one machine's `control agent`: answers only its own RPC
	// subject, writes instance state, never sees certificates.
	RoleAgent = "agent"
	// RoleMesh is one machine's meshd: registers, reads mesh peers, writes
	// only its own heartbeat and drift report.
	RoleMesh = "mesh"
)

// Roles lists the roles IssueCreds accepts.
var Roles = []string{RoleControl, RoleGateway, RoleAgent, RoleMesh}

// Auth is the key material of an installation's NATS operator, loaded from
// (or created in) an auth dir.
type Auth struct {
	Dir string

	operatorKP  nkeys.KeyPair
	operatorJWT string
	accountKP   nkeys.KeyPair
	accountPub  string
	accountJWT  string
	sysKP       nkeys.KeyPair
	sysPub      string
	sysJWT      string
	// ClusterSecret authenticates routes between storage nodes.
	ClusterSecret string
}

const (
	authOperatorSeed = "operator.nk"
	authAccountSeed  = "account.nk"
	authSystemSeed   = "system.nk"
	authClusterFile  = "cluster.secret"
)

// AccountPublicKey names the account every edgeplane user belongs to; the
// JetStream store keeps its streams under this name.
func (a *Auth) AccountPublicKey() string { return a.accountPub }

// LoadAuth reads the auth dir; with create, a missing one is initialised
// with fresh keys. Every storage node of a cluster must use a copy of the
// same dir.
func LoadAuth(dir string, create bool) (*Auth, error) {
	if dir == "" {
		return nil, errors.New("auth dir: a directory is required")
	}
	_, err := os.Stat(filepath.Join(dir, authAccountSeed))
	switch {
	case errors.Is(err, os.ErrNotExist) && create:
		if err := initAuth(dir); err != nil {
			return nil, err
		}
	case errors.Is(err, os.ErrNotExist):
		return nil, &store.Error{Code: store.CodeNotFound, Message: fmt.Sprintf("auth dir %s has no keys: run `control server --auth` once (it creates them) or copy the dir from a storage node", dir),
			Detail: map[string]string{"dir": dir}}
	case err != nil:
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	a := &Auth{Dir: dir}
	read := func(name string) (nkeys.KeyPair, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("auth dir: %w", err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("auth dir: %s: %w", name, err)
		}
		return kp, nil
	}
	if a.operatorKP, err = read(authOperatorSeed); err != nil {
		return nil, err
	}
	if a.accountKP, err = read(authAccountSeed); err != nil {
		return nil, err
	}
	if a.sysKP, err = read(authSystemSeed); err != nil {
		return nil, err
	}
	sec, err := os.ReadFile(filepath.Join(dir, authClusterFile))
	if err != nil {
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	a.ClusterSecret = strings.TrimSpace(string(sec))
	if err := a.encodeClaims(); err != nil {
		return nil, err
	}
	return a, nil
}

func initAuth(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("auth dir: %w", err)
	}
	for _, f := range []struct {
		name string
		mk   func() (nkeys.KeyPair, error)
	}{{authOperatorSeed, nkeys.CreateOperator}, {authAccountSeed, nkeys.CreateAccount}, {authSystemSeed, nkeys.CreateAccount}} {
		kp, err := f.mk()
		if err != nil {
			return fmt.Errorf("creating %s: %w", f.name, err)
		}
		seed, _ := kp.Seed()
		if err := os.WriteFile(filepath.Join(dir, f.name), append(seed, '\n'), 0o600); err != nil {
			return fmt.Errorf("auth dir: %w", err)
		}
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, authClusterFile), []byte(base64.RawURLEncoding.EncodeToString(raw[:])+"\n"), 0o600)
}

// encodeClaims derives the operator and account JWTs from the keys. They
// are deterministic in content, so every node holding the same keys trusts
// the same accounts.
func (a *Auth) encodeClaims() error {
	opub, _ := a.operatorKP.PublicKey()
	a.accountPub, _ = a.accountKP.PublicKey()
	a.sysPub, _ = a.sysKP.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "edgeplane"
	oc.SystemAccount = a.sysPub
	var err error
	if a.operatorJWT, err = oc.Encode(a.operatorKP); err != nil {
		return fmt.Errorf("encoding operator: %w", err)
	}
	if a.accountJWT, err = a.accountClaims(nil).Encode(a.operatorKP); err != nil {
		return fmt.Errorf("encoding account: %w", err)
	}
	if a.sysJWT, err = a.systemClaims(nil).Encode(a.operatorKP); err != nil {
		return fmt.Errorf("encoding system account: %w", err)
	}
	return nil
}

// accountClaims is the edgeplane account, with revoked users (public key
// to the time of revocation) refused.
func (a *Auth) accountClaims(revoked map[string]time.Time) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(a.accountPub)
	ac.Name = "edgeplane"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	for user, at := range revoked {
		ac.RevokeAt(user, at)
	}
	return ac
}

func (a *Auth) systemClaims(revoked map[string]time.Time) *jwt.AccountClaims {
	sc := jwt.NewAccountClaims(a.sysPub)
	sc.Name = "SYS"
	for user, at := range revoked {
		sc.RevokeAt(user, at)
	}
	return sc
}

func (a *Auth) configure(opts *server.Options) error {
	oc, err := jwt.DecodeOperatorClaims(a.operatorJWT)
	if err != nil {
		return fmt.Errorf("operator: %w", err)
	}
	res := &server.MemAccResolver{}
	if err := res.Store(a.accountPub, a.accountJWT); err != nil {
		return err
	}
	if err := res.Store(a.sysPub, a.sysJWT); err != nil {
		return err
	}
	// A role's user JWT lists its permissions; the CONNECT line that carries
	// it exceeds the default 4 KiB control line limit.
	if opts.MaxControlLine < 64<<10 {
		opts.MaxControlLine = 64 << 10
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{oc}
	opts.AccountResolver = res
	opts.SystemAccount = a.sysPub
	return nil
}

// CredsRequest says whom to issue credentials for.
type CredsRequest struct {
	Role string
	// Machine is required for the agent and mesh roles: their permissions
	// name it.
	Machine string
	// Name labels the user (default role[-machine]).
	Name  string
	Names store.Names
	// TTL, if set, makes the credentials expire.
	TTL time.Duration
	// System issues a system-account user (storage operations that NATS
	// reserves to it, e.g. removing a server from the meta group).
	System bool
}

// IssueCreds returns a credentials file for r.
func (a *Auth) IssueCreds(r CredsRequest) ([]byte, error) {
	if r.Names.Authority == "" {
		r.Names, _ = store.NewNames("", "")
	}
	perms, err := RolePermissions(r.Role, r.Machine, r.Names)
	if err != nil {
		return nil, err
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = r.Name
	if uc.Name == "" {
		uc.Name = r.Role
		if r.Machine != "" {
			uc.Name += "-" + r.Machine
		}
	}
	uc.Tags.Add("role:" + r.Role)
	if r.Machine != "" {
		uc.Tags.Add("machine:" + r.Machine)
	}
	if r.TTL > 0 {
		uc.Expires = time.Now().Add(r.TTL).Unix()
	}
	signer := a.accountKP
	if r.System {
		signer = a.sysKP
		uc.Permissions = jwt.Permissions{}
	} else {
		uc.Permissions = perms
		if r.Role != RoleControl {
			uc.Permissions.Sub.Allow.Add(store.InboxPrefix(upub) + ".>")
		}
	}
	ujwt, err := uc.Encode(signer)
	if err != nil {
		return nil, fmt.Errorf("signing credentials: %w", err)
	}
	seed, _ := ukp.Seed()
	return jwt.FormatUserConfig(ujwt, seed)
}

// RolePermissions are the subject permissions of role.
func RolePermissions(role, machine string, n store.Names) (jwt.Permissions, error) {
	var p jwt.Permissions
	needMachine := role == RoleAgent || role == RoleMesh
	if needMachine && !store.ValidToken(machine) {
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("role %s needs --machine ID (letters, digits, '-', '_'), got %q", role, machine)}
	}
	if !needMachine && machine != "" && role != RoleGateway {
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("role %s is not bound to a machine", role)}
	}
	// readStream lets a role read one stream (bucket streams are "KV_<bucket>").
	readStream := func(stream string) {
		p.Pub.Allow.Add(
			"$JS.API.STREAM.MSG.GET."+stream, "$JS.API.DIRECT.GET."+stream, "$JS.API.DIRECT.GET."+stream+".>",
			"$JS.API.CONSUMER.CREATE."+stream, "$JS.API.CONSUMER.CREATE."+stream+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+stream+".>",
			"$JS.API.CONSUMER.DELETE."+stream+".*", "$JS.API.CONSUMER.INFO."+stream+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+stream+".*", "$JS.ACK."+stream+".>", "$JS.FC."+stream+".>")
	}
	readKV := func(bucket string) { readStream("KV_" + bucket) }
	writeKV := func(bucket, key string) { p.Pub.Allow.Add("$KV." + bucket + "." + key) }
	common := func() {
		// Stream info is metadata (config and counts), which every
		// client's store.Open needs to bind its handles.
		p.Pub.Allow.Add("$JS.API.INFO", "$JS.API.STREAM.INFO.*")
		p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	switch role {
	case RoleControl:
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
		return p, nil
	case RoleGateway:
		// What the custom Caddy (and a standalone edgeplane-dns) does,
		// as run end to end in integration's gateway-credentials test.
		common()
		// Projection load (LoadRouting): every namespace's live commit
		// through a last-per-subject consumer, then an ephemeral consumer
		// on the routing stream from the loaded sequence on.
		readStream(n.DeployCommitsStream())
		readStream(n.RoutingEventsStream())
		// Projection load: a watch of every instance and machine record.
		readKV(n.InstancesBucket())
		readKV(n.MachinesBucket())
		// The routing observation `control deploy apply` waits for.
		writeKV(n.GatewaysBucket(), ">")
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
		// Renewal work: the shared durable consumer takes items, and a
		// worker schedules the next one (a message schedule per host).
		readStream(n.CertRenewalsStream())
		// A lease's quorum check asks the storage nodes which are missing
		// when no stream leader answers (CheckQuorum).
		p.Pub.Allow.Add(n.CertRenewalsWildcard(), n.StorageStatusSubject())
	case RoleAgent:
		common()
		readStream(n.DeployCommitsStream())
		for _, b := range []string{n.InstancesBucket(), n.MachinesBucket(), n.InvitesBucket()} {
			readKV(b)
		}
		// Only its own machine's instance records: the key names the
		// machine (store.InstanceKey), so one agent cannot mark another
		// machine's instances ready, failed or gone.
		writeKV(n.InstancesBucket(), store.InstanceKey("*", machine, "*"))
		writeKV(n.InvitesBucket(), "invite.*")
		writeKV(n.MachinesBucket(), machine)
		// Its own mesh peer record only (a KV get is a direct get naming
		// the key): the agent advertises the machine's mesh IP.
		peers := n.MeshPeersBucket()
		p.Pub.Allow.Add("$JS.API.DIRECT.GET.KV_" + peers + ".$KV." + peers + "." + store.MeshPeerKey(machine))
		// No routing events of services: after one of its instances
		// drains, fails or restarts the agent asks the control plane to
		// republish the service from stored state, on its own machine's
		// subject (RequestRepublish), so it cannot forge where a
		// service's traffic goes.
		p.Pub.Allow.Add(n.RoutingRepublishSubject(machine), n.RoutingMachineSubject(machine), n.StorageStatusSubject())
		p.Sub.Allow.Add(n.NodeListenSubject(machine))
	case RoleMesh:
		common()
		for _, b := range []string{n.MeshPeersBucket(), n.MeshHeartbeatsBucket(), n.MeshDriftBucket(), n.MachinesBucket()} {
			readKV(b)
		}
		writeKV(n.MeshHeartbeatsBucket(), store.MeshBeatKey(machine))
		writeKV(n.MeshDriftBucket(), store.MeshDriftKey(machine))
		// Only its own machine's registrar subjects: credentials for one
		// machine cannot register (or remove) another.
		p.Pub.Allow.Add(n.RegistrarSubject("register."+machine), n.RegistrarSubject("leave."+machine))
	default:
		return p, &store.Error{Code: store.CodeInvalid, Message: fmt.Sprintf("unknown role %q: want one of %s", role, strings.Join(Roles, ", "))}
	}
	// Replies to this user's own requests only (see store.InboxPrefix); the
	// user's key is not known yet, so the prefix is added when signing.
	return p, nil
}
