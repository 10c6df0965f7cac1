package enroll

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// RenewalConfig is what a control server renews boxes' credentials with.
type RenewalConfig struct {
	Store *store.Store
	// Auth signs the renewed JWTs.
	Auth *storagenode.Auth
	// CredsTTL is the lifetime of renewed credentials; 0 for
	// storagenode.DefaultCredsTTL.
	CredsTTL time.Duration
	Logger   *zap.Logger
}

// ServeRenewals answers boxes' renewals of their own credentials
// (store.RenewCreds) until ctx ends or the returned stop is called; every
// control server holding the account keys runs it.
//
// Whom to renew is never taken from the request: the storage node says
// which user key asked (the import shares it), and the renewed JWT has
// that key's recorded role, machine and name, and the fleet's lifetime.
// The subject (which the asker's credentials bind) must name the same
// role and machine. A key that is not recorded, is revoked, or is not an
// edge role's renews nothing.
func ServeRenewals(ctx context.Context, cfg RenewalConfig) (func(), error) {
	log := cmp.Or(cfg.Logger, zap.NewNop())
	ttl := cmp.Or(cfg.CredsTTL, storagenode.DefaultCredsTTL)
	s := cfg.Store
	return store.Serve(ctx, s.NC, s.Names.CredsSubject("*", "*", "*"), "creds", "rpc.creds",
		func(ctx context.Context, command string, data []byte) (any, error) {
			parts := strings.Split(command, ".")
			if len(parts) != 3 {
				return nil, store.Errorf(store.CodeInvalid, "unknown credentials request %q", command)
			}
			verb, role, id := parts[0], parts[1], parts[2]
			rec, err := asker(ctx, cfg, role, id)
			if err != nil {
				log.Warn("credentials request refused", zap.String("request", command), zap.Error(err))
				return nil, err
			}
			switch verb {
			case "renew":
				return renew(ctx, cfg, rec, data, ttl, log)
			case "retire":
				return nil, retire(ctx, cfg, rec, data, log)
			}
			return nil, store.Errorf(store.CodeInvalid, "unknown credentials request %q", verb)
		})
}

// asker is the record of the key that sent the request, checked against
// the subject it came on.
func asker(ctx context.Context, cfg RenewalConfig, role, id string) (*store.CredentialRecord, error) {
	who, ok := store.RequesterOf(ctx)
	if !ok || who.Account != cfg.Auth.EdgeAccountPublicKey() {
		return nil, store.Errorf(store.CodeUnauthorized, "a credentials request must come from a box's own credentials (agent, mesh or gateway)")
	}
	rec, err := cfg.Store.Credential(ctx, who.User)
	if store.HasCode(err, store.CodeNotFound) {
		return nil, store.Errorf(store.CodeUnauthorized, "credentials %s are not recorded (issued before credentials were recorded?): they cannot be renewed; issue new ones", who.User).
			With("user", who.User)
	}
	if err != nil {
		return nil, err
	}
	if !slices.Contains(Roles, rec.Role) || rec.Role != role || store.CredsSubjectID(rec.Machine) != id {
		return nil, store.Errorf(store.CodeUnauthorized, "credentials %s are %s credentials of %q: they renew only their own", who.User, rec.Role, rec.Machine).
			With("user", who.User)
	}
	// Fail closed: a revocation that cannot be read is not known absent,
	// and a renewal would hand a revoked key a fresh one.
	revoked, err := cfg.Store.UserRevoked(ctx, who.User)
	if err != nil {
		return nil, fmt.Errorf("renewing %s: %w", who.User, err)
	}
	if revoked {
		return nil, store.Errorf(store.CodeUnauthorized, "credentials %s are revoked", who.User).With("user", who.User)
	}
	return rec, nil
}

// strict decodes a request refusing fields it does not know: a request
// asking for a lifetime, a role or a machine is refused, not half-read.
func strict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return store.Errorf(store.CodeInvalid, "credentials request: %w (a renewal names its new public key only)", err)
	}
	return nil
}

func renew(ctx context.Context, cfg RenewalConfig, rec *store.CredentialRecord, data []byte, ttl time.Duration, log *zap.Logger) (*store.CredsRenewed, error) {
	var req store.CredsRenewal
	if err := strict(data, &req); err != nil {
		return nil, err
	}
	if !nkeys.IsValidPublicUserKey(req.PublicKey) || req.PublicKey == rec.User {
		return nil, store.Errorf(store.CodeInvalid, "%q is not a new user public key (U...)", req.PublicKey)
	}
	cr := storagenode.CredsRequest{Role: rec.Role, Machine: rec.Machine, Name: rec.Name, Names: cfg.Store.Names, TTL: ttl,
		InboxKey: cmp.Or(rec.Inbox, rec.User)}
	j, err := cfg.Auth.SignUser(cr, req.PublicKey)
	if err != nil {
		return nil, err
	}
	next, err := store.CredentialOfJWT(j, store.IssuedByRenewal)
	if err != nil {
		return nil, err
	}
	next.RenewedFrom = rec.User
	if err := cfg.Store.RecordCredential(ctx, next); err != nil {
		return nil, fmt.Errorf("recording the renewed credentials: %w", err)
	}
	log.Info("credentials renewed", zap.String("role", rec.Role), zap.String("machine", rec.Machine), zap.String("from", rec.User),
		zap.String("user", next.User), zap.Time("expires", next.ExpiresAt))
	return &store.CredsRenewed{JWT: j}, nil
}

// retire revokes the key the asker was renewed from: the box switched.
func retire(ctx context.Context, cfg RenewalConfig, rec *store.CredentialRecord, data []byte, log *zap.Logger) error {
	var req store.CredsRetirement
	if err := strict(data, &req); err != nil {
		return err
	}
	if req.User == "" || req.User != rec.RenewedFrom {
		return store.Errorf(store.CodeUnauthorized, "credentials %s were not renewed from %q: a box retires only the key it renewed", rec.User, req.User).
			With("user", rec.User)
	}
	// Asked again (the answer to the first was lost: a revocation changes
	// the edge account, which may drop answers crossing it just then): done
	// already, and not done twice, which would change the account again.
	if revoked, _ := cfg.Store.UserRevoked(ctx, req.User); revoked {
		return nil
	}
	var expires time.Time
	if prev, err := cfg.Store.Credential(ctx, req.User); err == nil {
		expires = prev.ExpiresAt
	}
	if err := cfg.Store.RevokeUser(ctx, &store.Revocation{User: req.User, Name: rec.Name, Role: rec.Role, Machine: rec.Machine,
		Reason: "renewed by " + rec.User, Expires: expires}); err != nil {
		return err
	}
	log.Info("renewed credentials retired", zap.String("role", rec.Role), zap.String("machine", rec.Machine), zap.String("user", req.User))
	return nil
}
