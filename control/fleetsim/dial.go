package fleetsim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Dialer opens one store per simulated agent or gateway, each on its own
// connection and, when Auth is set, with credentials of that role issued
// for it alone (an agent's name its machine): what the server lets a
// simulated agent do is what it lets a real one do.
type Dialer struct {
	// URLs of the storage nodes, comma-separated (the client picks one at
	// random, so a fleet spreads over them).
	URLs string
	// Auth issues the credentials; nil dials without any (a loopback
	// server with authentication off).
	Auth *storagenode.Auth
	// Dir holds the credentials files issued.
	Dir   string
	Names store.Names
}

// Agent opens a store with machine's agent credentials.
func (d *Dialer) Agent(ctx context.Context, machine string) (*store.Store, error) {
	return d.open(ctx, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: machine}, "agent-"+machine)
}

// Gateway opens a store with gateway credentials bound to name.
func (d *Dialer) Gateway(ctx context.Context, name string) (*store.Store, error) {
	return d.open(ctx, storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: name}, "gateway-"+name)
}

// Control opens a store with control-plane credentials.
func (d *Dialer) Control(ctx context.Context) (*store.Store, error) {
	return d.open(ctx, storagenode.CredsRequest{Role: storagenode.RoleControl}, "control")
}

// PrepareAgent issues machine's agent credentials ahead of Agent, which
// then finds them, as a box finds the credentials it was enrolled with.
func (d *Dialer) PrepareAgent(_ context.Context, machine string) error {
	_, err := d.creds(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: machine}, "agent-"+machine)
	return err
}

// creds issues req's credentials to a file named for name, unless one is
// there already; "" without Auth.
func (d *Dialer) creds(req storagenode.CredsRequest, name string) (string, error) {
	if d.Auth == nil {
		return "", nil
	}
	file := filepath.Join(d.Dir, name+".creds")
	if _, err := os.Stat(file); err == nil {
		return file, nil
	}
	req.Names = d.Names
	b, err := d.Auth.IssueCreds(req)
	if err != nil {
		return "", fmt.Errorf("credentials for %s: %w", name, err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return "", fmt.Errorf("credentials for %s: %w", name, err)
	}
	return file, nil
}

func (d *Dialer) open(ctx context.Context, req storagenode.CredsRequest, name string) (*store.Store, error) {
	o := store.ConnectOptions{URL: d.URLs, Name: "fleetsim-" + name, ReconnectForever: true}
	var err error
	if o.CredsFile, err = d.creds(req, name); err != nil {
		return nil, err
	}
	nc, err := store.Connect(o)
	if err != nil {
		return nil, fmt.Errorf("connecting %s: %w", name, err)
	}
	s, err := store.Open(ctx, nc, d.Names)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("opening the store as %s: %w", name, err)
	}
	return s, nil
}
