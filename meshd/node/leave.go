package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// LeaveOptions are `meshd leave`'s inputs.
type LeaveOptions struct {
	DataDir string
	NATSURL string // overrides the saved URL
	// CredsFile overrides the credentials saved at join.
	CredsFile string
	// CAFile overrides the CA bundle saved at join.
	CAFile string
	// Purge also deletes the private key and every cached file.
	Purge   bool
	Timeout time.Duration
}

// Leave removes this node from the mesh: the registrar deletes its peer
// record (peers drop it from their configs) and cools its IP down; then a
// running meshd on the data dir tears its device down; then local state
// goes. If the registrar cannot be reached, nothing changes and the error
// says so.
func Leave(ctx context.Context, o LeaveOptions) (*store.MeshLeaveReply, error) {
	if o.DataDir == "" {
		return nil, errors.New("--data is required")
	}
	st, err := LoadState(o.DataDir)
	if err != nil {
		if errors.Is(err, ErrNotJoined) && o.Purge {
			return nil, purge(o.DataDir)
		}
		return nil, err
	}
	url := st.NATSURL
	if o.NATSURL != "" {
		url = o.NATSURL
	}
	creds := st.CredsFile
	if o.CredsFile != "" {
		if creds, err = checkCreds(o.CredsFile); err != nil {
			return nil, err
		}
	}
	caFile := cmp.Or(o.CAFile, st.CAFile)
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	names, err := store.NewNames(st.Installation, st.Authority)
	if err != nil {
		return nil, err
	}
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: creds, CAFile: caFile, Name: "meshd leave " + st.Machine, Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("leaving needs the control plane; nothing was changed: %w", connectErr(err, creds))
	}
	defer nc.Close()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rep store.MeshLeaveReply
	req := store.MeshLeaveRequest{Version: store.RecordVersion, Machine: st.Machine, Secret: st.Secret}
	if err := callRegistrar(cctx, nc, names, "leave", st.Machine, creds, req, &rep); err != nil {
		return nil, fmt.Errorf("leaving the mesh (nothing was changed locally): %w", err)
	}
	if err := RequestShutdown(cctx, o.DataDir); err != nil && !errors.Is(err, ErrNotRunning) {
		return &rep, err
	}
	if o.Purge {
		return &rep, purge(o.DataDir)
	}
	// Keep the key for a later re-join; drop membership and cached peers.
	for _, f := range []string{stateFile, peersFile} {
		if err := os.Remove(filepath.Join(o.DataDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return &rep, fmt.Errorf("removing %s: %w", f, err)
		}
	}
	return &rep, nil
}

func purge(dir string) error {
	for _, f := range []string{keyFile, nextKeyFile, stateFile, peersFile, SocketName} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("purging %s: %w", f, err)
		}
	}
	// Remove the dir itself only if nothing else lives there.
	_ = os.Remove(dir)
	return nil
}
