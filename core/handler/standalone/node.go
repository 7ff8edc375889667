package standalone

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// The pieces of Run for a program that runs several VMIs through one Handler, each in a
// sandbox of its own (kubevisor-bench memory).

// Prepare returns cfg with the standalone defaults filled in, and the manifests of its drivers'
// kubevisor-driver-<name> binaries in binDir (none when cfg names a plugin directory), as Run
// uses them: give both to handler.New, and the returned configuration to NewSandbox.
func Prepare(cfg handler.Config, binDir string) (handler.Config, []plugin.Manifest, error) {
	cfg = withDefaults(cfg, binDir)
	if cfg.PluginDir != "" {
		return cfg, nil, nil
	}
	// Without a plugin directory, the binaries next to kubevisor-handler are trusted as they are.
	ms, err := cfg.Drivers.Manifests(binDir)
	if err != nil {
		return cfg, nil, fmt.Errorf("driver plugins: %w (build them with make build, or set pluginDir)", err)
	}
	return cfg, ms, nil
}

// NewSandbox makes the sandbox of vmi (its UID names it) with cfg as Prepare returned it; on
// failure it removes what it made. grace is the launcher's --grace-period. Give it to the
// handler (Options.Sandboxes) for the VMI; the handler's Stop closes it.
func NewSandbox(ctx context.Context, log hclog.Logger, cfg handler.Config, vmi *v1alpha1.VirtualMachineInstance, grace time.Duration) (*Sandbox, error) {
	if cfg.Standalone == nil {
		return nil, fmt.Errorf("sandbox of %s: the configuration has no standalone section (Prepare fills it in)", vmiName(vmi))
	}
	return newSandbox(ctx, log, cfg, vmi, grace)
}

// LauncherPid is the launcher process's pid.
func (s *Sandbox) LauncherPid() int { return s.launcher.Process.Pid }

// NetNS is the name of the sandbox's network namespace.
func (s *Sandbox) NetNS() string { return s.name }
