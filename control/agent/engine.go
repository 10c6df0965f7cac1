package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/runtime"
)

// EngineNone is the engine setting of an agent that runs no containers.
const EngineNone = "none"

// ConnectEngine connects the container driver to engine (a socket URL such
// as unix:///run/podman/podman.sock). "" tries runtime.DefaultEngineSockets
// and settles for none; EngineNone is none. A nil driver and nil error
// mean no engine: services with an image are refused on this machine.
func ConnectEngine(ctx context.Context, engine string, logger *zap.Logger) (*runtime.Container, error) {
	if engine == EngineNone {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if engine != "" {
		c, err := runtime.ConnectEngine(cctx, engine)
		if err != nil {
			return nil, fmt.Errorf("container engine %s: %w", engine, err)
		}
		logger.Info("container engine", zap.String("engine", engine), zap.String("api_version", c.APIVersion))
		return c, nil
	}
	for _, sock := range runtime.DefaultEngineSockets {
		if _, err := os.Stat(strings.TrimPrefix(sock, "unix://")); err != nil {
			continue
		}
		if c, err := runtime.ConnectEngine(cctx, sock); err == nil {
			logger.Info("container engine", zap.String("engine", sock), zap.String("api_version", c.APIVersion))
			return c, nil
		}
	}
	logger.Info("no container engine: services with an image are refused on this machine (see --engine)")
	return nil, nil
}
