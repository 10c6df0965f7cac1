// Package store is the shared plumbing of edgeplane: the NATS connection (or
// an embedded nats-server with JetStream), the names of every stream, bucket,
// subject and lock, the wire records the parts exchange, leases with fencing
// tokens, and request/reply helpers whose failures are structured.
//
// Every other part of edgeplane imports this package instead of spelling a
// NATS name or a record layout itself, so that the control plane, the
// gateway, DNS, certificates and the mesh always agree on the layout.
package store
