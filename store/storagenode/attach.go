package storagenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// AttachConfig says how Attach binds a process to storage nodes it does
// not run: an external NATS cluster, or an edgeplane cluster's storage
// nodes.
type AttachConfig struct {
	// URL of the storage nodes (comma-separated URLs for several).
	// Required.
	URL string
	// CredsFile, if set, is the credentials to connect with.
	CredsFile string
	// CAFile, if set, replaces the fleet CA the credentials carry.
	CAFile string
	// Names scope every stream and bucket; an empty field is its default
	// (store.NewNames).
	Names store.Names
	// Provision creates the streams and buckets that are missing, as a
	// storage node does; false binds to what the storage nodes
	// provisioned, waiting until they have.
	Provision bool
	// Replicas, with Provision, of every stream and bucket when first
	// created; default 1.
	Replicas int
	// ClientName names the connection in server monitoring; default
	// "control server".
	ClientName string
	// Progress receives the lines a person starting the process wants to
	// see; nil discards them.
	Progress io.Writer
	// StartTimeout bounds the wait for JetStream and the store; default
	// DefaultStartTimeout.
	StartTimeout time.Duration
}

// Attach connects to cfg.URL, waits for JetStream and binds to the store
// (provisioning it when cfg.Provision), retrying until the timeout. The
// returned Node has no Server; Close closes the connection.
func Attach(ctx context.Context, cfg AttachConfig) (_ *Node, err error) {
	if cfg.URL == "" {
		return nil, errors.New("attaching to storage nodes: a URL is required")
	}
	names, err := store.NewNames(cfg.Names.Installation, cfg.Names.Authority)
	if err != nil {
		return nil, store.Errorf(store.CodeInvalid, "attaching to storage nodes: %w", err)
	}
	progress := orDiscard(cfg.Progress)
	n := &Node{CredsFile: cfg.CredsFile}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, orDefault(cfg.StartTimeout, DefaultStartTimeout))
	defer cancel()
	if err := n.connect(wctx, store.ConnectOptions{URL: cfg.URL, CredsFile: cfg.CredsFile, CAFile: cfg.CAFile, Name: cfg.ClientName}); err != nil {
		return nil, err
	}
	if cfg.Provision {
		n.Store, err = provision(wctx, n.Conn, names, store.Layout{Replicas: cfg.Replicas}, progress, nil)
		if err != nil {
			return nil, err
		}
		return n, nil
	}
	// A client binds to what the storage nodes provisioned, once they
	// have.
	err = retry(wctx, func() error {
		s, err := store.Bind(wctx, n.Conn, names)
		n.Store = s
		return err
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "not a storage node: client of %s, hosting no replicated state\n", cfg.URL)
	return n, nil
}
