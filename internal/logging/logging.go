// Package logging builds the one zap logger an edgeplane binary runs with,
// as Caddy does: JSON lines, one per event, at the level an operator picks.
// Progress meant for a person at a terminal (a deploy's steps) is not
// logging and stays on stdout.
package logging

import (
	"fmt"
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger writing to w at level (debug, info, warn or error).
// Nothing is sampled away: these processes log events, not requests.
func New(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl), zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), nil
}
