package liveconfig

import (
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
)

// HandlerLevel returns an Applier that sets the node handler's log level: logger's (an hclog
// root logger, whose SetLevel its named sub-loggers, and so the driver plugins' relayed
// lines, follow) and, when not nil, slogLevel (the handler's controller-runtime logger) to the
// configuration's logVerbosity.handler, or back to base (the --log-level flag) when the
// configuration has none. The driver processes themselves are not told: they log at every
// level and the handler filters what they send.
func HandlerLevel(logger hclog.Logger, slogLevel *slog.LevelVar, base string, log logr.Logger) Applier {
	return func(c Config) {
		want := base
		if v := c.LogVerbosity; v != nil && v.Handler != "" {
			want = v.Handler
		}
		level := hclog.LevelFromString(want)
		if level == hclog.NoLevel {
			log.Info("unknown handler log level: kept", "level", want)
			return
		}
		if logger.GetLevel() == level {
			return
		}
		logger.SetLevel(level)
		if slogLevel != nil {
			slogLevel.Set(SlogLevel(level))
		}
		log.Info("log level set", "level", want)
	}
}

// SlogLevel is the slog level of an hclog level (trace is below slog's debug).
func SlogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}
