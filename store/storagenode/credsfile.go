package storagenode

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
)

// ControlCredsFile is the name, in a storage node's data dir, of the
// control credentials Boot keeps when credentials are required: issued at
// the first start and again only when they no longer serve (see
// keepControlCreds); the CLI on that box points --creds at it.
const ControlCredsFile = "control.creds"

// WriteCredsFile issues credentials for r and writes them to path, private
// to this user (0600) and whole: they appear under path only once written,
// so a reader never sees half a file. Errors name the file.
func (a *Auth) WriteCredsFile(path string, r CredsRequest) error {
	b, err := a.IssueCreds(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// TempCredsFile issues short-lived credentials for a command's own
// connection into a private temporary file; remove deletes it.
func (a *Auth) TempCredsFile(r CredsRequest) (file string, remove func(), err error) {
	b, err := a.IssueCreds(r)
	if err != nil {
		return "", nil, err
	}
	f, err := os.CreateTemp("", "edgeplane-"+r.Name+"-*.creds")
	if err != nil {
		return "", nil, fmt.Errorf("writing %s credentials: %w", r.Name, err)
	}
	remove = func() { os.Remove(f.Name()) }
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("writing %s credentials: %w", r.Name, err)
	}
	return f.Name(), remove, nil
}

// controlCredsName names the credentials Boot keeps for its own
// connection (ControlCredsFile).
const controlCredsName = "control-server"

// keepControlCreds makes path hold this node's control credentials: the
// ones already there when they are still good for a (see
// reusableControlCreds), else new ones. It reports why it minted new
// ones, "" when it kept the file. Keeping them means a restart adds no
// credential to the fleet: every start minting one left a trail of
// never-expiring control credentials on disk and in backups.
func (a *Auth) keepControlCreds(path string, names store.Names) (minted string, err error) {
	why := a.reusableControlCreds(path, names)
	if why == "" {
		// Whatever mode the file was left with, it is private again.
		if err := os.Chmod(path, 0o600); err != nil {
			return "", fmt.Errorf("control credentials %s: %w", path, err)
		}
		return "", nil
	}
	if err := a.WriteCredsFile(path, CredsRequest{Role: RoleControl, Names: names, Name: controlCredsName}); err != nil {
		return "", err
	}
	return why, nil
}

// reusableControlCreds says why the credentials in path cannot serve as
// this node's control credentials, "" when they can: they exist, are
// signed by a's control account, grant the control role of names, name
// a's trust root, have not expired, hold the seed of the user they name,
// and carry a's CA bundle (none when a speaks no TLS). Revocation is
// checked once the store can be read (Boot).
func (a *Auth) reusableControlCreds(path string, names store.Names) string {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "none yet"
	}
	if err != nil {
		return err.Error()
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	uc, err := jwt.DecodeUserClaims(token) // verifies the signature
	if err != nil {
		return "unreadable: " + err.Error()
	}
	seed, err := jwt.ParseDecoratedUserNKey(b)
	if err != nil {
		return "no user seed: " + err.Error()
	}
	if pub, err := seed.PublicKey(); err != nil || pub != uc.Subject {
		return "the seed is not the named user's"
	}
	if uc.Issuer != a.accountPub || uc.IssuerAccount != "" {
		return "signed by other auth keys"
	}
	if uc.Expires != 0 && time.Unix(uc.Expires, 0).Before(time.Now().Add(time.Hour)) {
		return "expired"
	}
	want, err := RolePermissions(RoleControl, "", names)
	if err != nil {
		return err.Error()
	}
	if !reflect.DeepEqual(uc.Permissions, want) || uc.Name != controlCredsName {
		return "made for other names or another role"
	}
	root := ""
	if a.SigningRoot != nil {
		root = store.TrustRootTag + a.SigningRoot.PublicKey()
	}
	var role, roots int
	for _, tag := range uc.Tags {
		switch {
		case tag == "role:"+RoleControl:
			role++
		case strings.HasPrefix(strings.ToLower(tag), strings.ToLower(store.TrustRootTag)):
			if !strings.EqualFold(tag, root) {
				return "made under another trust root"
			}
			roots++
		}
	}
	if role != 1 || (root != "" && roots != 1) {
		return "made for another role or trust root"
	}
	hasCA := bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----"))
	switch {
	case a.TLS == nil && hasCA:
		return "carries a CA bundle, and the node speaks no TLS"
	case a.TLS != nil && !bytes.Contains(b, a.TLS.BundlePEM):
		return "does not carry the current fleet CA bundle"
	}
	return ""
}
