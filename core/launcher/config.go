package launcher

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
)

// Names of the files in a launcher's directory. The sockets' names are the SDK's
// (core/driver/launcher), which clients use.
const (
	SocketName      = lclient.SocketName
	FilesSocketName = lclient.FilesSocketName
	StatusFileName  = "launcher-status.json"
	lockFileName    = "launcher.lock"
)

// maxKillMargin caps the default kill margin (a fifth of the grace period).
const maxKillMargin = 5 * time.Second

// Config is how a launcher runs (kubevisor-launcher's flags).
type Config struct {
	// Dir is the per-VMI directory the launcher serves in (created 0700 if missing; otherwise it
	// must be owned by the launcher's user, without group or world access).
	Dir string
	// GracePeriod is how long after SIGTERM the VM process may take to stop
	// (terminationGracePeriodSeconds; kubevisor-launcher's default is a VMI's,
	// layout.DefaultGracePeriod). Zero kills it at once.
	GracePeriod time.Duration
	// KillMargin is how long before the end of GracePeriod the launcher starts to force the
	// process down (SIGTERM, then SIGKILL half a margin later), so that it is gone before the
	// kubelet's SIGKILL. Zero means a fifth of the grace period, at most 5 s.
	KillMargin time.Duration
	// VMI names the VMI, for logs and the status file.
	VMI string
	// Logger receives the launcher's logs; nil means JSON to stderr.
	Logger *slog.Logger
}

// withDefaults checks c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Dir == "" {
		return c, errors.New("no directory (--dir)")
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return c, fmt.Errorf("directory: %w", err)
	}
	c.Dir = dir
	if c.GracePeriod < 0 || c.KillMargin < 0 {
		return c, errors.New("negative grace period or kill margin")
	}
	if c.KillMargin == 0 {
		c.KillMargin = min(c.GracePeriod/5, maxKillMargin)
	}
	c.KillMargin = min(c.KillMargin, c.GracePeriod)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if c.VMI != "" {
		c.Logger = c.Logger.With("vmi", c.VMI)
	}
	return c, nil
}
