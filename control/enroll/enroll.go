// Package enroll gives a joining box its credentials without its private
// keys ever leaving it, as kubeadm and k3s joins do. The box makes its own
// NATS user keys (one per role it runs), checks the storage node it talks
// to against the CA its invite names before it sends anything, and sends
// the invite and its public keys; a control server on a storage node
// (which holds the account keys) redeems the invite for the machine and
// answers with a user JWT per key and the fleet's CA bundle. The box writes
// one credentials file per role.
//
// Enrollment is HTTPS on its own port (DefaultPort), beside the storage
// node's NATS port: a box without credentials cannot open a NATS
// connection to ask.
package enroll

import (
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// DefaultPort is where a storage node's control server answers
// enrollments unless told otherwise.
const DefaultPort = 4223

// Path is the enrollment endpoint.
const Path = "/v1/enroll"

// Roles a box may enroll for with an invite: what runs on a box. The
// control role is never handed out this way.
var Roles = []string{storagenode.RoleAgent, storagenode.RoleMesh, storagenode.RoleGateway}

// Request is what a box sends.
type Request struct {
	// Token is the invite, secret and all.
	Token string `json:"token"`
	// Machine is the box's machine ID; the invite is bound to it.
	Machine string `json:"machine"`
	// Keys are the user public keys (U...) the box made, by role.
	Keys map[string]string `json:"keys"`
}

// Reply is what a box gets.
type Reply struct {
	// JWTs are the user JWTs for Request.Keys, by role.
	JWTs map[string]string `json:"jwts"`
	// Bundle is the fleet's CA bundle in PEM.
	Bundle string `json:"bundle"`
}

// maxRequest bounds a request body.
const maxRequest = 64 << 10
