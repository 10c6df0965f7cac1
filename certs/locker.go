package certs

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Lock takes the lock for name (see LockKey for how certmagic's names map
// to lease keys), blocking until it is free or ctx ends. While held, the
// lease is renewed every TTL/3; if this process dies, the lease expires
// within the TTL and a waiter elsewhere takes it. A waiter asks again after
// 25ms, doubling up to LockPollMax: a gateway may create no consumer, so it
// cannot watch the key.
func (s *Storage) Lock(ctx context.Context, name string) error {
	key := LockKey(name)
	wait := 25 * time.Millisecond
	for {
		st, err := s.writeStore(ctx, "taking lock "+name)
		if err != nil {
			s.logRefused("certificate lock refused: the store is unreachable", name, err)
			return err
		}
		ok, err := s.tryLock(ctx, st, name, key)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return store.Classify(fmt.Errorf("waiting for lock %s (%s): %w", name, key, ctx.Err()))
		case <-t.C:
			wait = min(wait*2, s.opts.LockPollMax)
		}
	}
}

// TryLock takes the lock for name if it is free and reports whether it did.
// A lock held by someone else is (false, nil); only failures to ask are
// errors.
func (s *Storage) TryLock(ctx context.Context, name string) (bool, error) {
	st, err := s.writeStore(ctx, "taking lock "+name)
	if err != nil {
		s.logRefused("certificate lock refused: the store is unreachable", name, err)
		return false, err
	}
	return s.tryLock(ctx, st, name, LockKey(name))
}

func (s *Storage) tryLock(ctx context.Context, st *store.Store, name, key string) (bool, error) {
	l, err := st.AcquireLeaseUnchecked(ctx, key, store.LeaseOptions{
		TTL: s.opts.LockTTL, Holder: s.opts.Holder, Purpose: name, KeepAlive: true,
	})
	if err != nil {
		if store.HasCode(err, store.CodeBusy) {
			return false, nil
		}
		return false, fmt.Errorf("taking lock %s: %w", name, err)
	}
	s.mu.Lock()
	s.held[key] = l
	s.mu.Unlock()
	s.debug("lock acquired", zap.String("name", name), zap.String("key", key), zap.Uint64("token", l.Token()))
	return true, nil
}

// Unlock releases our lease on name. It deletes the key only if it still
// carries our fencing token: a lease that expired and was taken by another
// holder is left alone (and reported in the log, since the critical section
// ran unprotected for a while).
func (s *Storage) Unlock(ctx context.Context, name string) error {
	key := LockKey(name)
	s.mu.Lock()
	l := s.held[key]
	delete(s.held, key)
	s.mu.Unlock()
	if l == nil {
		return fmt.Errorf("unlocking %s: this process does not hold %s", name, key)
	}
	lost := l.Lost()
	if err := l.Release(ctx); err != nil {
		return fmt.Errorf("unlocking %s: %w", name, err)
	}
	if lost != nil {
		s.log.Warn("lock lease was lost before unlock", zap.String("name", name), zap.String("key", key), zap.Error(lost))
	}
	s.debug("lock released", zap.String("name", name), zap.String("key", key))
	return nil
}

// RenewLockLease confirms and extends our lease on name now. certmagic asks
// for a lease of leaseDuration (minutes: a retry interval plus the obtain
// timeout); we keep the short TTL instead, because the keep-alive already
// renews the lease for as long as this process lives, and a dead holder must
// free the lock within the TTL, not after minutes. It fails with lease_lost if
// the lease expired or was taken over, which makes certmagic abort the
// attempt instead of racing the new holder.
func (s *Storage) RenewLockLease(ctx context.Context, name string, leaseDuration time.Duration) error {
	key := LockKey(name)
	s.mu.Lock()
	l := s.held[key]
	s.mu.Unlock()
	if l == nil {
		return &store.Error{Code: store.CodeLeaseLost, Message: fmt.Sprintf("renewing lock %s: this process does not hold %s", name, key),
			Detail: map[string]string{"key": key}}
	}
	if err := l.Renew(ctx); err != nil {
		return fmt.Errorf("renewing lock %s: %w", name, err)
	}
	s.debug("lock renewed", zap.String("name", name), zap.Duration("requested", leaseDuration), zap.Duration("ttl", s.opts.LockTTL))
	return nil
}

// LockHolder reports who holds the lock for name, if anyone (for status
// output and tests).
func (s *Storage) LockHolder(ctx context.Context, name string) (store.LeaseHolder, bool, error) {
	st := s.readStore(ctx)
	if st == nil {
		return store.LeaseHolder{}, false, s.unavailable("reading lock " + name)
	}
	return lockHolder(ctx, st, LockKey(name))
}

func lockHolder(ctx context.Context, st *store.Store, key string) (store.LeaseHolder, bool, error) {
	h, err := st.LockHolder(ctx, key)
	if store.HasCode(err, store.CodeNotFound) {
		return store.LeaseHolder{}, false, nil
	}
	if err != nil {
		return store.LeaseHolder{}, false, err
	}
	return *h, true, nil
}
