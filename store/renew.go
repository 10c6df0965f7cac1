package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
)

// Renewing a box's credentials. Edge credentials expire (30 days unless the
// fleet says otherwise), and a running box renews its own over the
// connection it has, so that only a box offline past its credentials'
// lifetime needs an operator:
//
//  1. at two thirds of the lifetime (RenewAt), the box makes a new key pair
//     and asks on its own renewal subject (Names.CredsSubject "renew", which
//     only its credentials may publish to) for a JWT for the new public key;
//  2. the control plane, told by the storage node which user key asked,
//     signs the same role, machine and name as that key's record, for the
//     fleet's lifetime, records the new key and answers the JWT;
//  3. the box writes its credentials file anew (0600, atomically, the CA
//     bundle kept) and reconnects: the connection reads the file at every
//     connect (credsHolder) and keeps its inbox, which renewed credentials
//     share with the key they renew;
//  4. connected with the new key, it asks to retire the old one, which the
//     control plane revokes.
//
// Processes sharing one credentials file (the gateway app and the
// certificate storage in one Caddy, edgeplane-dns beside it) take turns
// under a lock file: the first renews, the others find the file renewed
// and switch to it.

// CredsRenewal asks for a JWT for a new key of the asker's own.
type CredsRenewal struct {
	Version int `json:"version"`
	// PublicKey is the new user public key (U...), made on the box.
	PublicKey string `json:"public_key"`
}

// CredsRenewed is the answer: the JWT for CredsRenewal.PublicKey.
type CredsRenewed struct {
	JWT string `json:"jwt"`
}

// CredsRetirement asks the control plane to revoke the key the asker's own
// renewed.
type CredsRetirement struct {
	Version int `json:"version"`
	// User is the key the asker was renewed from.
	User string `json:"user"`
}

// RenewAt is when credentials issued at issued and expiring at expires are
// renewed: at two thirds of their lifetime.
func RenewAt(issued, expires time.Time) time.Time {
	return issued.Add(expires.Sub(issued) * 2 / 3)
}

// RenewCreds keeps the credentials s connected with fresh until ctx ends:
// renewing them at RenewAt, and switching to credentials another process
// sharing the file renewed. Credentials without an expiry, or of the
// control role, are left alone. report is told what went wrong (a renewal
// is tried again until the credentials expire, then report is told once
// that the box must be invited again).
func RenewCreds(ctx context.Context, s *Store, report func(error)) {
	h := holderOf(s.NC)
	if h == nil {
		return
	}
	if report == nil {
		report = func(error) {}
	}
	failures := 0
	var saidExpired bool
	for {
		cur, _ := h.current()
		if cur.expires.IsZero() || cur.role == "" || cur.role == "control" {
			return
		}
		wait := time.Until(RenewAt(cur.issued, cur.expires))
		if failures > 0 {
			// Retried often enough to make it well before the expiry,
			// rarely enough not to press a control plane that is away.
			wait = min(max(time.Until(cur.expires)/10, 5*time.Second), time.Minute)
		}
		if !time.Now().Before(cur.expires) {
			if !saidExpired {
				report(cur.expiredError(h.file))
				saidExpired = true
			}
			// A file given new credentials of this line is taken at the
			// next reconnect; look again now and then.
			wait = 30 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
		if !time.Now().Before(cur.expires) {
			continue
		}
		if err := renewOnce(ctx, s, h); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			report(fmt.Errorf("renewing the credentials in %s (they expire at %s): %w", h.file, cur.expires.UTC().Format(time.RFC3339), err))
			continue
		}
		failures, saidExpired = 0, false
	}
}

// renewOnce renews h's credentials, or switches to those another process
// sharing the file renewed.
func renewOnce(ctx context.Context, s *Store, h *credsHolder) error {
	unlock, err := lockFile(h.file + ".lock")
	if err != nil {
		return err
	}
	// Held while the file is read and written, not while switching: the
	// other processes sharing the file switch at the same time.
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	cur, _ := h.current()
	onDisk, err := readCreds(h.file)
	if err != nil {
		return err
	}
	if onDisk.pub != cur.pub && onDisk.inbox == cur.inbox && time.Now().Before(RenewAt(onDisk.issued, onDisk.expires)) {
		// Renewed by another process: switch, and leave retiring the old
		// key to it.
		unlock()
		locked = false
		return switchTo(ctx, s, h, onDisk.pub, "")
	}
	if time.Now().Before(RenewAt(cur.issued, cur.expires)) {
		// Switched meanwhile (another process retired the old key, and
		// the reconnect took the file): nothing is due.
		return nil
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	var rep CredsRenewed
	subject := s.Names.CredsSubject("renew", cur.role, CredsSubjectID(cur.machine))
	if err := Call(ctx, s.NC, subject, cur.machine, "creds.renew", CredsRenewal{Version: RecordVersion, PublicKey: pub}, &rep); err != nil {
		return err
	}
	data, err := jwt.FormatUserConfig(rep.JWT, seed)
	if err != nil {
		return fmt.Errorf("renewed credentials: %w", err)
	}
	if i := bytes.Index(onDisk.contents, []byte(BundleHeader)); i >= 0 {
		data = AppendBundle(data, bytes.TrimLeft(onDisk.contents[i+len(BundleHeader):], "\n"))
	}
	next, err := parseCreds(h.file, data)
	switch {
	case err != nil:
		return fmt.Errorf("renewed credentials: %w", err)
	case next.pub != pub || next.role != cur.role || next.machine != cur.machine || next.inbox != cur.inbox:
		return Errorf(CodeInternal, "the renewed credentials are for %s (%s of %q, inbox %s), not the key asked for (%s of %q)",
			next.pub, next.role, next.machine, next.inbox, cur.role, cur.machine)
	}
	if err := atomicfile.Write(h.file, data, 0o600); err != nil {
		return fmt.Errorf("writing the renewed credentials: %w", err)
	}
	unlock()
	locked = false
	if s.log != nil {
		s.log.Info("credentials renewed", zap.String("creds", h.file), zap.String("role", cur.role), zap.String("machine", cur.machine),
			zap.String("user", pub), zap.Time("expires", next.expires))
	}
	return switchTo(ctx, s, h, pub, cur.pub)
}

// switchTo reconnects s with the credentials of key pub (in h's file) and,
// once connected with them, asks the control plane to retire old ("" to
// leave it).
func switchTo(ctx context.Context, s *Store, h *credsHolder, pub, old string) error {
	// A reconnect leaves a gap in which a request to this process's
	// responders (an agent's RPC subject) reaches no one, and loses the
	// answers to what the process asked just before. So a bridge
	// connection with the new key takes the requests (in the same queue
	// groups) while this one stops taking them, finishes what it took,
	// and reconnects at a moment none of its responders is answering.
	svs := servedBy(s.NC)
	stopBridge := bridge(ctx, s, h, svs)
	defer stopBridge()
	var draining []*nats.Subscription
	if len(svs) > 0 {
		for _, sv := range svs {
			if sub := sv.pause(); sub != nil {
				draining = append(draining, sub)
			}
		}
		defer func() {
			for _, sv := range svs {
				_ = sv.subscribe()
			}
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = s.NC.FlushWithContext(fctx)
			cancel()
		}()
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = s.NC.FlushWithContext(fctx)
		cancel()
	}
	for deadline := time.Now().Add(10 * time.Second); (busy(svs) || anyValid(draining)) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := s.NC.ForceReconnect(); err != nil {
		return fmt.Errorf("reconnecting with the renewed credentials: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, used := h.current()
		if used == pub && s.NC.Status() == nats.CONNECTED {
			break
		}
		if time.Now().After(deadline) {
			return Errorf(CodeUnavailable, "not reconnected with the renewed credentials %s after 30s", pub)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if old == "" {
		return nil
	}
	cur, _ := h.current()
	subject := s.Names.CredsSubject("retire", cur.role, CredsSubjectID(cur.machine))
	var err error
	// The revocation changes the edge account on every storage node,
	// which may lose the answer crossing it: asked again, the control
	// plane answers that it is done.
	for range 3 {
		if err = Call(ctx, s.NC, subject, cur.machine, "creds.retire", CredsRetirement{Version: RecordVersion, User: old}, nil); err == nil ||
			!HasCode(err, CodeRPCFailure) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		// Still good until it expires; said, not fatal.
		return fmt.Errorf("switched to the renewed credentials %s, but retiring %s: %w", pub, old, err)
	}
	return nil
}

// bridge connects with h's file (the new key) and answers what Serve
// answers on s's connection, until the returned func: that drains it,
// waits for the answers of what it took, and closes it.
func bridge(ctx context.Context, s *Store, h *credsHolder, svs []*served) func() {
	if len(svs) == 0 {
		return func() {}
	}
	o := h.opts
	o.Name += " (switching keys)"
	nc, err := Connect(o)
	if err != nil {
		if s.log != nil {
			s.log.Warn("no bridge while switching to renewed credentials: requests to this process in the gap go unanswered", zap.Error(err))
		}
		return func() {}
	}
	var answering sync.WaitGroup
	var subs []*nats.Subscription
	for _, sv := range svs {
		sub, err := nc.QueueSubscribe(sv.subject, sv.queue, func(m *nats.Msg) {
			answering.Add(1)
			sv.handle(m, answering.Done)
		})
		if err == nil {
			subs = append(subs, sub)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_ = nc.FlushWithContext(fctx)
	cancel()
	return func() {
		for _, sub := range subs {
			_ = sub.Drain()
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if !anyValid(subs) {
				break
			}
		}
		done := make(chan struct{})
		go func() { answering.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
		}
		nc.Close()
	}
}

// anyValid reports whether one of subs is still draining.
func anyValid(subs []*nats.Subscription) bool {
	for _, sub := range subs {
		if sub.IsValid() {
			return true
		}
	}
	return false
}

// busy reports whether one of svs is answering a request.
func busy(svs []*served) bool {
	for _, sv := range svs {
		if sv.inflight.Load() > 0 {
			return true
		}
	}
	return false
}

// lockFile takes an exclusive lock on path (made 0600 if missing), held
// until the returned func is called: one renewal at a time among the
// processes sharing a credentials file.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("credentials lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("credentials lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
