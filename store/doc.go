// Package store is the shared client plumbing of edgeplane: the NATS
// connection, the names of every stream, bucket, subject and lock, the wire
// records the parts exchange, leases with fencing tokens, and request/reply
// helpers whose failures are structured.
//
// Every other part of edgeplane imports this package instead of spelling a
// NATS name or a record layout itself, so that the control plane, the
// gateway, DNS, certificates and the mesh always agree on the layout. The
// layout carries one decision others act on: which streams and buckets a
// storage node syncs before it acknowledges a write, and which live
// observations it may lose to a power cut (Durability, durability.go). It
// links no NATS server: running one (a storage node) is package
// store/storagenode, which only `control` imports.
package store
