// Package certs lets a fleet of gateways share TLS certificates through the
// control plane's NATS JetStream store instead of each box keeping its own.
//
// It provides a certmagic.Storage on the certificates KV bucket (so every
// gateway sees the same certificates, ACME accounts and HTTP-01 challenge
// tokens), a certmagic Locker on the store's leases (so exactly one gateway
// places an ACME order for a name, and a dead holder's lock expires), hostname
// normalisation (so `Shop.example.com.` and `shop.example.com` are one lock and
// one storage key), a fleet-wide ACME order budget per registered domain, and
// renewal as visible work: renewals are scheduled messages in JetStream and
// every outcome is a durable status record (ListStatus).
//
// The package is Caddy-free; certs/caddystorage is the thin Caddy module.
package certs
