// Package relay is a TURN relay (RFC 8656, via pion/turn) that `control
// server` runs so that two meshd nodes with no direct UDP path still reach
// each other, and the client side meshd uses to get an address on it. The
// relay carries only WireGuard ciphertext: it never sees keys or plaintext.
//
// The relay is deliberately not an open UDP proxy. A node may relay only to
// other allocations on the same relay: permissions and channel binds to any
// address but the relay's own are refused, and a relayed socket writes only
// to ports that are live allocations. Credentials are TURN REST style
// (draft-uberti-behave-turn-rest): "<unix expiry>:<machine>" with the
// base64 HMAC-SHA1 of that under a secret the control server and relay share.
//
// pion/turn relays IPv4 only (its allocations are "udp4"), so the relay's
// addresses are IPv4.
package relay
