package storagenode

import (
	"fmt"
	"os"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
)

// ControlCredsFile is the name, in a storage node's data dir, of the
// control credentials Boot issues at every start when credentials are
// required: the CLI on that box points --creds at it.
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
