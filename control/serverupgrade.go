package main

import (
	"context"
	"fmt"
	"io"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/storage"
)

// launchStorageNode is the start of a storage node's `control server` as
// far as its release goes: it runs the release its data dir's releases
// name (going on as it, in this process, when that is another binary),
// and runs the health gate of a release on trial. A release it is told
// to move to (control storage upgrade), or a rollback, ends the server
// through stop; finish, called with the server's result once everything
// has stopped, then goes on as that binary in this process, or returns
// the result as it is.
func launchStorageNode(ctx context.Context, stop func(), data string, progress io.Writer, logger *zap.Logger) (*storage.NodeUpgrades, func(error) error, error) {
	node, err := storage.LaunchNode(data, logger.Named("upgrade"))
	if err != nil {
		return nil, nil, err
	}
	node.Bind(stop)
	gated := make(chan struct{})
	go func() {
		defer close(gated)
		node.Gate(ctx)
	}()
	finish := func(err error) error {
		stop()
		<-gated
		path, reason := node.Restart()
		if path == "" {
			return err
		}
		fmt.Fprintf(progress, "control server restarting as %s: %s\n", path, reason)
		_ = logger.Sync()
		return node.Exec()
	}
	return node, finish, nil
}
