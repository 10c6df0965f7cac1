package storagenode

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
)

// Role-scoped credentials. A storage node runs its embedded server in NATS
// operator mode: one operator and three accounts. The control account holds
// every stream and bucket and the trusted users (control servers, operators'
// CLI). The edge account holds every untrusted user (agents, meshd,
// gateways): it has no JetStream of its own, and reaches the control
// account only through the subjects it imports (see edgeClaims). The system
// account is NATS's own.
//
// Why a second account: in one account, a user's request names any reply
// subject, and JetStream (or any responder) publishes its answer there with
// the account's reach, so a stream or a lock key could be written by anyone
// allowed to ask anything; and a push consumer delivers wherever its
// creator says. Across the import, an answer always returns to the asker's
// account, where nothing is stored, and the edge account imports no
// consumer creation at all.
//
// A credentials file is a user JWT signed by its account plus the user's
// nkey seed; the JWT carries the role's subject permissions and limits, so
// any storage node accepts it without a user list, and issuing one needs
// the account keys that only storage nodes hold (the auth dir, part of the
// store trust boundary).

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
	edgeKP      nkeys.KeyPair
	edgePub     string
	edgeJWT     string
	// ClusterSecret authenticates routes between storage nodes.
	ClusterSecret string
	// SigningRoot is the trust root of signed intent (package signing),
	// nil in an auth dir that holds none; credentials carry its public key.
	SigningRoot *signing.Key
	// TLS is the fleet CA, nil in an auth dir made before TLS existed;
	// credentials carry its bundle.
	TLS *FleetTLS
	// StoreKey encrypts the JetStream store of every storage node using
	// this auth dir ("" in an auth dir made before encryption at rest:
	// `control storage encrypt` makes one).
	StoreKey string
}

const (
	authOperatorSeed = "operator.nk"
	authAccountSeed  = "account.nk"
	authSystemSeed   = "system.nk"
	authClusterFile  = "cluster.secret"
	// authStoreKeyFile encrypts storage nodes' JetStream stores at rest.
	authStoreKeyFile = "jetstream.key"
)

// AccountPublicKey names the account every edgeplane user belongs to; the
// JetStream store keeps its streams under this name.
func (a *Auth) AccountPublicKey() string { return a.accountPub }

// EdgeAccountPublicKey names the account of the untrusted roles (agent,
// mesh, gateway): where a request that crossed the edge imports came from.
func (a *Auth) EdgeAccountPublicKey() string { return a.edgePub }

// LoadAuth reads the auth dir; with create, a missing one is initialised
// with fresh keys. Every storage node of a cluster must use a copy of the
// same dir.
func LoadAuth(dir string, create bool) (*Auth, error) { return loadAuth(dir, create, true) }

// loadAuth is LoadAuth; withStoreKey says whether a new auth dir gets the
// store key (Boot puts a node's elsewhere when the auth dir is inside its
// data dir).
func loadAuth(dir string, create, withStoreKey bool) (*Auth, error) {
	if dir == "" {
		return nil, errors.New("auth dir: a directory is required")
	}
	_, err := os.Stat(filepath.Join(dir, authAccountSeed))
	switch {
	case errors.Is(err, os.ErrNotExist) && create:
		if err := initAuth(dir); err != nil {
			return nil, err
		}
		// A new auth dir comes with the fleet CA and the store key: TLS
		// and encryption at rest from the first start.
		if _, err := InitFleetTLS(dir, nil); err != nil {
			return nil, err
		}
		if withStoreKey {
			if _, err := InitStoreKey(dir); err != nil {
				return nil, err
			}
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
	if a.edgeKP, err = edgeAccountKey(a.accountKP); err != nil {
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
	if create {
		a.SigningRoot, _, err = signing.LoadOrCreateRoot(dir)
	} else {
		a.SigningRoot, err = signing.LoadRoot(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	if a.TLS, err = LoadFleetTLS(dir); err != nil {
		return nil, err
	}
	if a.StoreKey, err = loadStoreKey(dir); err != nil {
		return nil, err
	}
	return a, nil
}

// loadStoreKey reads the store key of auth dir dir, "" when it has none.
func loadStoreKey(dir string) (string, error) {
	key, err := readStoreKeyFile(filepath.Join(dir, authStoreKeyFile))
	if err != nil {
		return "", fmt.Errorf("auth dir: %w", err)
	}
	return key, nil
}

// InitStoreKey gives auth dir dir a key that encrypts a storage node's
// JetStream store at rest, and returns it; a dir that has one keeps it
// (see storekey.go for where a node looks for its key).
func InitStoreKey(dir string) (string, error) {
	return InitStoreKeyFile(filepath.Join(dir, authStoreKeyFile))
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
		if err := atomicfile.Write(filepath.Join(dir, f.name), append(seed, '\n'), 0o600); err != nil {
			return fmt.Errorf("auth dir: %w", err)
		}
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, authClusterFile), []byte(base64.RawURLEncoding.EncodeToString(raw[:])+"\n"), 0o600)
}

// edgeAccountKey derives the edge account's key from the control account's
// seed: every storage node holding the same auth dir derives the same, and
// an auth dir made before the edge account existed needs no new file.
func edgeAccountKey(account nkeys.KeyPair) (nkeys.KeyPair, error) {
	seed, err := account.Seed()
	if err != nil {
		return nil, fmt.Errorf("auth dir: account seed: %w", err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("auth dir: account seed: %w", err)
	}
	h := sha256.Sum256(append([]byte("edgeplane edge account\x00"), raw...))
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, h[:])
	if err != nil {
		return nil, fmt.Errorf("deriving the edge account: %w", err)
	}
	return kp, nil
}

// encodeClaims derives the operator and account JWTs from the keys. They
// are deterministic in content, so every node holding the same keys trusts
// the same accounts.
func (a *Auth) encodeClaims() error {
	opub, _ := a.operatorKP.PublicKey()
	a.accountPub, _ = a.accountKP.PublicKey()
	a.sysPub, _ = a.sysKP.PublicKey()
	a.edgePub, _ = a.edgeKP.PublicKey()
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
	if a.edgeJWT, err = a.edgeClaims(nil).Encode(a.operatorKP); err != nil {
		return fmt.Errorf("encoding edge account: %w", err)
	}
	return nil
}

// imported is one subject the edge account imports from the control
// account: a service (requests into it, one answer or a stream of them)
// or a stream (messages out of it).
type imported struct {
	subject string
	stream  bool
	// many answers per request (direct get batches, pulls, every storage
	// node's status).
	many bool
	// share: the responder is told which user asked (nats-server's
	// Nats-Request-Info header, store.RequesterOf), written by the
	// storage node whatever the client sent.
	share bool
}

// edgeImports is everything the edge account may reach in the control
// account. What each user of it may use is narrower still: its role's
// permissions (RolePermissions). The JetStream API and KV writes arrive in
// the edge account under store.EdgeAPIPrefix, where nats.go's API prefix
// puts them; other subjects keep their names.
var edgeImports = []imported{
	// Binding to streams and buckets, and direct gets: reads whose answers
	// go back to the asker. No consumer can be created.
	{subject: "$JS.API.STREAM.INFO.*"},
	{subject: "$JS.API.DIRECT.GET.>", many: true},
	// The shared renewal work: pulls from the one durable consumer the
	// control plane provisions, and the acknowledgements.
	{subject: "$JS.API.CONSUMER.INFO.*." + store.RenewalsConsumer},
	{subject: "$JS.API.CONSUMER.MSG.NEXT.*." + store.RenewalsConsumer, many: true},
	{subject: "$JS.ACK.*." + store.RenewalsConsumer + ".>"},
	// Writes of keys and of renewal schedules, acknowledged to the writer.
	{subject: "$KV.>"},
	{subject: "cp.*.certs.>"},
	// Requests to the control plane.
	{subject: "edgeplane.v1.*.*.rpc.registrar.>"},
	{subject: "edgeplane.v1.*.*.rpc.routing.republish.*"},
	{subject: "edgeplane.v1.*.*.rpc.admission.>"},
	// A box's own credentials: the control plane renews (or retires) the
	// key that asked, as the storage node names it.
	{subject: "edgeplane.v1.*.*.rpc.creds.>", share: true},
	{subject: "edgeplane.v1.*.*.storage.status", many: true},
	// What streams republish once stored: routing events, mesh peers.
	{subject: "rp.>", stream: true},
}

// agentRPC is the agents' RPC subject space: the edge account exports it,
// the control account imports it, so the orchestrator's requests reach the
// agents and their answers come back.
const agentRPC = "edgeplane.v1.*.*.rpc.node.>"

// accessLines are the access lines gateways publish: the edge account
// exports them as a stream, the control account imports it, where the
// access-log stream keeps them and `control logs --access` reads them.
const accessLines = "cp.*.access.>"

// edgeLocal is the subject an import arrives under in the edge account.
func edgeLocal(subject string) string {
	if rest, ok := strings.CutPrefix(subject, "$JS.API."); ok {
		return store.EdgeAPIPrefix + "." + rest
	}
	if strings.HasPrefix(subject, "$KV.") {
		return store.EdgeAPIPrefix + "." + subject
	}
	return subject
}

// edgeClaims is the account of every untrusted user: no JetStream, and only
// the imports above.
func (a *Auth) edgeClaims(revoked map[string]time.Time) *jwt.AccountClaims {
	ec := jwt.NewAccountClaims(a.edgePub)
	ec.Name = "edgeplane-edge"
	for _, im := range edgeImports {
		i := &jwt.Import{Name: im.subject, Subject: jwt.Subject(im.subject), Account: a.accountPub, Type: jwt.Service}
		if im.stream {
			i.Type = jwt.Stream
		}
		i.Share = im.share
		if local := edgeLocal(im.subject); local != im.subject {
			i.LocalSubject = jwt.RenamingSubject(local)
		}
		ec.Imports.Add(i)
	}
	ec.Exports.Add(&jwt.Export{Name: "agent rpc", Subject: agentRPC, Type: jwt.Service})
	ec.Exports.Add(&jwt.Export{Name: "access lines", Subject: accessLines, Type: jwt.Stream})
	for user, at := range revoked {
		ec.RevokeAt(user, at)
	}
	return ec
}

// accountClaims is the edgeplane account, with revoked users (public key
// to the time of revocation) refused.
func (a *Auth) accountClaims(revoked map[string]time.Time) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(a.accountPub)
	ac.Name = "edgeplane"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	for _, im := range edgeImports {
		e := &jwt.Export{Name: im.subject, Subject: jwt.Subject(im.subject), Type: jwt.Service}
		switch {
		case im.stream:
			e.Type = jwt.Stream
		case im.many:
			e.ResponseType = jwt.ResponseTypeStream
		}
		ac.Exports.Add(e)
	}
	ac.Imports.Add(&jwt.Import{Name: "agent rpc", Subject: agentRPC, Account: a.edgePub, Type: jwt.Service})
	ac.Imports.Add(&jwt.Import{Name: "access lines", Subject: accessLines, Account: a.edgePub, Type: jwt.Stream})
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
	if err := res.Store(a.edgePub, a.edgeJWT); err != nil {
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

// DefaultCredsTTL is how long a box's credentials last unless the fleet
// says otherwise (`control server --creds-ttl`, `control creds issue
// --ttl`): a running box renews them at two thirds of it
// (store.RenewAt), so a box offline longer must be invited again.
const DefaultCredsTTL = 30 * 24 * time.Hour

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
	// InboxKey is the user key whose inbox the credentials answer on
	// (store.InboxKeyOf); default the credentials' own. A renewal keeps
	// the first key's, so a running process keeps its reply
	// subscriptions when it switches keys.
	InboxKey string
	// System issues a system-account user (storage operations that NATS
	// reserves to it, e.g. removing a server from the meta group).
	System bool
}

// IssueCreds returns a credentials file for r: a new user key, its JWT,
// and the fleet's CA bundle. The user's private key is made here: for a
// box whose key must never leave it, SignUser signs its own public key.
func (a *Auth) IssueCreds(r CredsRequest) ([]byte, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := ukp.PublicKey()
	ujwt, err := a.SignUser(r, upub)
	if err != nil {
		return nil, err
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil || a.TLS == nil {
		return creds, err
	}
	return store.AppendBundle(creds, a.TLS.BundlePEM), nil
}

// SignUser returns the user JWT of r for the user public key upub (U...),
// whose seed its holder keeps.
func (a *Auth) SignUser(r CredsRequest, upub string) (string, error) {
	if !nkeys.IsValidPublicUserKey(upub) {
		return "", store.Errorf(store.CodeInvalid, "%q is not a user public key (U...)", upub).With("user", upub)
	}
	if r.Names.Authority == "" {
		r.Names, _ = store.NewNames("", "")
	}
	perms, err := RolePermissions(r.Role, r.Machine, r.Names)
	if err != nil {
		return "", err
	}
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
	if a.SigningRoot != nil {
		// Readers verify intent under this root (store.CredsTrustRoot).
		uc.Tags.Add(store.TrustRootTag + a.SigningRoot.PublicKey())
	}
	if r.TTL > 0 {
		uc.Expires = time.Now().Add(r.TTL).Unix()
	}
	signer := a.accountKP
	switch {
	case r.System:
		signer = a.sysKP
		uc.Permissions = jwt.Permissions{}
	case r.Role == RoleControl:
		uc.Permissions = perms
	default:
		// An untrusted role is a user of the edge account.
		signer = a.edgeKP
		uc.Permissions = perms
		inbox := r.InboxKey
		if inbox == "" {
			inbox = upub
		} else if !nkeys.IsValidPublicUserKey(inbox) {
			return "", store.Errorf(store.CodeInvalid, "inbox key %q is not a user public key (U...)", inbox)
		}
		uc.Permissions.Sub.Allow.Add(store.InboxPrefix(inbox) + ".>")
		uc.Limits.Payload = roleLimits[r.Role]
	}
	ujwt, err := uc.Encode(signer)
	if err != nil {
		return "", fmt.Errorf("signing credentials: %w", err)
	}
	return ujwt, nil
}

// withoutTLS is a, issuing credentials without the fleet's bundle: for a
// node that speaks no TLS.
func (a *Auth) withoutTLS() *Auth {
	c := *a
	c.TLS = nil
	return &c
}

// storeKeyCheckFile, in a data dir, names the store key its store was
// encrypted with, by a hash: a start with another key is refused before
// nats-server finds it cannot read its streams (and the store, provisioned
// again, would look empty).
const storeKeyCheckFile = "jetstream.keycheck"

// checkStoreKey refuses key for dataDir's store if the store was written
// with another, and records key's check for a store that has none yet.
func checkStoreKey(dataDir, key string) error {
	sum := sha256.Sum256([]byte("edgeplane store key check\x00" + key))
	want := hex.EncodeToString(sum[:])
	path := filepath.Join(dataDir, storeKeyCheckFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil && strings.TrimSpace(string(b)) != want:
		return store.Errorf(store.CodeInvalid, "the store in %s was encrypted with another store key than the one given: start it with the key it was written with (see `control server --store-key`)", dataDir).
			With("data", dataDir)
	case err == nil:
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return atomicfile.Write(path, []byte(want+"\n"), 0o600)
}
