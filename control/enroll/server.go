package enroll

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// ServerConfig is what a control server answers enrollments with.
type ServerConfig struct {
	// Listen is the HTTPS address, host:port.
	Listen string
	// TLS presents the storage node's certificate (its chain carries the
	// CA a box checks against its invite).
	TLS *tls.Config
	// Store redeems invites.
	Store *store.Store
	// Auth signs the boxes' user JWTs; it must hold the fleet CA.
	Auth *storagenode.Auth
	// CredsTTL is how long the credentials it signs last (the box renews
	// them while it runs); 0 for storagenode.DefaultCredsTTL.
	CredsTTL time.Duration
	Logger   *zap.Logger
}

// Server answers enrollments until ctx ends or Close.
type Server struct {
	cfg  ServerConfig
	log  *zap.Logger
	l    net.Listener
	srv  *http.Server
	done chan struct{}
}

// Serve starts answering enrollments on cfg.Listen.
func Serve(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.TLS == nil || cfg.Auth == nil || cfg.Auth.TLS == nil || cfg.Store == nil {
		return nil, errors.New("enrollment: a TLS config, an auth dir with the fleet CA and a store are required")
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	l, err := tls.Listen("tcp", cfg.Listen, cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("enrollment on %s: %w", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, log: log, l: l, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+Path, s.enroll)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		ErrorLog: zap.NewStdLog(log)}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(l)
	}()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Close stops the server, letting requests in flight finish for a while.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}

func (s *Server) enroll(w http.ResponseWriter, r *http.Request) {
	var req Request
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, store.Errorf(store.CodeInvalid, "enrollment request: %w", err))
		return
	}
	rep, err := s.answer(r.Context(), req)
	if err != nil {
		s.log.Warn("enrollment refused", zap.String("machine", req.Machine), zap.String("remote", r.RemoteAddr), zap.Error(err))
		writeError(w, err)
		return
	}
	s.log.Info("box enrolled", zap.String("machine", req.Machine), zap.String("remote", r.RemoteAddr))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rep)
}

// answer redeems the invite for a new machine and signs the box's keys.
// An invite admits a machine that is not a member yet, once: taking over an
// existing machine (re-keying it) is an operator's act, `control machine rm`
// first. Everything is checked before anything is signed, recorded or
// spent.
func (s *Server) answer(ctx context.Context, req Request) (*Reply, error) {
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: letters, digits, '-' and '_' only", req.Machine).With("machine", req.Machine)
	}
	if len(req.Keys) == 0 {
		return nil, store.Errorf(store.CodeInvalid, "enrollment asks for no role: want keys for some of %v", Roles)
	}
	for role, pub := range req.Keys {
		if !slices.Contains(Roles, role) {
			return nil, store.Errorf(store.CodeInvalid, "role %q cannot be enrolled with an invite: want some of %v", role, Roles).With("role", role)
		}
		if !nkeys.IsValidPublicUserKey(pub) {
			return nil, store.Errorf(store.CodeInvalid, "%s key %q is not a user public key (U...)", role, pub).With("role", role)
		}
	}
	if err := s.newMachine(ctx, req.Machine); err != nil {
		return nil, err
	}
	ttl := s.cfg.CredsTTL
	if ttl <= 0 {
		ttl = storagenode.DefaultCredsTTL
	}
	// Signed before the invite is spent: a request that cannot be
	// answered does not bind it.
	jwts := map[string]string{}
	for role, pub := range req.Keys {
		cr := storagenode.CredsRequest{Role: role, Machine: req.Machine, Names: s.cfg.Store.Names, TTL: ttl}
		if role == storagenode.RoleGateway {
			cr.Name = "gateway-" + req.Machine
		}
		j, err := s.cfg.Auth.SignUser(cr, pub)
		if err != nil {
			return nil, err
		}
		jwts[role] = j
	}
	if _, err := invites.Redeem(ctx, s.cfg.Store, req.Token, req.Machine, store.InviteUseEnroll); err != nil {
		return nil, err
	}
	// Every key handed out is recorded before it is: an operator finds
	// it in `control creds ls`, and `control machine rm` revokes it.
	for _, role := range slices.Sorted(maps.Keys(jwts)) {
		rec, err := store.CredentialOfJWT(jwts[role], store.IssuedByEnrollment)
		if err == nil {
			err = s.cfg.Store.RecordCredential(ctx, rec)
		}
		if err != nil {
			return nil, fmt.Errorf("recording the %s credentials of machine %s: %w", role, req.Machine, err)
		}
		s.log.Info("credentials issued", zap.String("machine", req.Machine), zap.String("role", role), zap.String("user", rec.User),
			zap.Time("expires", rec.ExpiresAt))
	}
	return &Reply{JWTs: jwts, Bundle: string(s.cfg.Auth.TLS.BundlePEM)}, nil
}

// newMachine refuses a machine ID the fleet already knows: a machine record
// or a mesh peer under it.
func (s *Server) newMachine(ctx context.Context, id string) error {
	existing := func(what string) error {
		return store.Errorf(store.CodeConflict, "machine %s is already a member (it has a %s): an invite enrolls a new machine only; "+
			"to enroll this box again, remove it first (`control machine rm %s`), or choose another --machine", id, what, id).With("machine", id)
	}
	switch _, _, err := s.cfg.Store.GetMachine(ctx, id); {
	case err == nil:
		return existing("machine record")
	case !store.HasCode(err, store.CodeNotFound):
		return err
	}
	switch _, err := s.cfg.Store.MeshPeer(ctx, id); {
	case err == nil:
		return existing("mesh peer record")
	case !store.HasCode(err, store.CodeNotFound):
		return err
	}
	return nil
}

// writeError answers err as a structured error, with an HTTP status that
// says what kind.
func writeError(w http.ResponseWriter, err error) {
	se := store.AsError(err)
	status := http.StatusInternalServerError
	switch se.Code {
	case store.CodeInvalid:
		status = http.StatusBadRequest
	case store.CodeNotFound:
		status = http.StatusNotFound
	case store.CodeConflict:
		status = http.StatusConflict
	case store.CodeUnavailable, store.CodeQuorumUnavailable:
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": se})
}
