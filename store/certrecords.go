package store

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// What package certs keeps in the store: certmagic's files (certificates,
// keys, ACME accounts, challenge tokens) under their encoded keys, each
// certificate's renewal status, the fleet's ACME order budget and the
// renewal work queue. The records' layouts are certs' own (they never
// leave it), so these read and write raw values; errors are nats.go's
// (jetstream.ErrKeyNotFound, a revision conflict), unclassified, for certs
// to tell them apart as it always has.

// GetCert reads the certificates bucket's value under key (an encoded
// certmagic key).
func (s *Store) GetCert(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return s.certs.Get(ctx, key)
}

// PutCert writes value under key in the certificates bucket.
func (s *Store) PutCert(ctx context.Context, key string, value []byte) (uint64, error) {
	return s.certs.Put(ctx, key, value)
}

// DeleteCert deletes key from the certificates bucket.
func (s *Store) DeleteCert(ctx context.Context, key string) error {
	return s.certs.Delete(ctx, key)
}

// ScanCerts is ScanKV of the certificates bucket.
func (s *Store) ScanCerts(ctx context.Context, filter string) ([]KVEntry, error) {
	return s.ScanKV(ctx, s.certs, filter)
}

// GetCertStatus reads the renewal status stored under key.
func (s *Store) GetCertStatus(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return s.certStatus.Get(ctx, key)
}

// PutCertStatus writes a renewal status under key.
func (s *Store) PutCertStatus(ctx context.Context, key string, value []byte) (uint64, error) {
	return s.certStatus.Put(ctx, key, value)
}

// ScanCertStatus is ScanKV of every renewal status.
func (s *Store) ScanCertStatus(ctx context.Context) ([]KVEntry, error) {
	return s.ScanKV(ctx, s.certStatus, ">")
}

// GetAcmeBudget reads the ACME order budget of a registered domain (key).
func (s *Store) GetAcmeBudget(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return s.acmeBudget.Get(ctx, key)
}

// CreateAcmeBudget writes a domain's first budget record; one already
// there is a conflict.
func (s *Store) CreateAcmeBudget(ctx context.Context, key string, value []byte) (uint64, error) {
	return s.acmeBudget.Create(ctx, key, value)
}

// UpdateAcmeBudget replaces a domain's budget record if it is still at
// revision last (compare and set).
func (s *Store) UpdateAcmeBudget(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	return s.acmeBudget.Update(ctx, key, value, last)
}

// RenewalConsumer binds the durable consumer of the renewal work queue
// named durable.
func (s *Store) RenewalConsumer(ctx context.Context, durable string) (jetstream.Consumer, error) {
	return s.renewals.Consumer(ctx, durable)
}

// CreateRenewalConsumer creates (or updates) a consumer of the renewal
// work queue: tests and tools that take renewal work under a durable of
// their own (the control plane provisions RenewalsConsumer).
func (s *Store) CreateRenewalConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return s.renewals.CreateOrUpdateConsumer(ctx, cfg)
}
