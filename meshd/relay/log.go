package relay

import (
	"fmt"

	"github.com/pion/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// pionLogs routes pion's logs through zap. pion logs at Info and Error for
// things a remote client causes (a refused permission, an expired
// username), so Trace, Debug and Info become Debug, and Warn and Error
// become Warn: nothing a peer sends can fill the log at Info or above.
type pionLogs struct{ log *zap.Logger }

func (f pionLogs) NewLogger(scope string) logging.LeveledLogger {
	return pionLogger{l: f.log.Named(scope), max: zapcore.WarnLevel}
}

// pionLogger logs at most at max.
type pionLogger struct {
	l   *zap.Logger
	max zapcore.Level
}

func (p pionLogger) log(lvl zapcore.Level, msg string) {
	lvl = min(lvl, p.max)
	if p.l.Core().Enabled(lvl) {
		p.l.Log(lvl, msg)
	}
}

func (p pionLogger) logf(lvl zapcore.Level, format string, args ...any) {
	lvl = min(lvl, p.max)
	// Format only when the level is on: pion logs every datagram at Debug.
	if p.l.Core().Enabled(lvl) {
		p.l.Log(lvl, fmt.Sprintf(format, args...))
	}
}

func (p pionLogger) Trace(msg string)                  { p.log(zapcore.DebugLevel, msg) }
func (p pionLogger) Tracef(format string, args ...any) { p.logf(zapcore.DebugLevel, format, args...) }
func (p pionLogger) Debug(msg string)                  { p.log(zapcore.DebugLevel, msg) }
func (p pionLogger) Debugf(format string, args ...any) { p.logf(zapcore.DebugLevel, format, args...) }
func (p pionLogger) Info(msg string)                   { p.log(zapcore.DebugLevel, msg) }
func (p pionLogger) Infof(format string, args ...any)  { p.logf(zapcore.DebugLevel, format, args...) }
func (p pionLogger) Warn(msg string)                   { p.log(zapcore.WarnLevel, msg) }
func (p pionLogger) Warnf(format string, args ...any)  { p.logf(zapcore.WarnLevel, format, args...) }
func (p pionLogger) Error(msg string)                  { p.log(zapcore.WarnLevel, msg) }
func (p pionLogger) Errorf(format string, args ...any) { p.logf(zapcore.WarnLevel, format, args...) }

// Interface guards
var (
	_ logging.LoggerFactory = pionLogs{}
	_ logging.LeveledLogger = pionLogger{}
)
