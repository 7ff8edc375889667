// Command kubevisor-deviceplugins runs Kubevisor's kubelet device plugins (package deviceplugins)
// on a node, for the device drivers the handler's configuration names:
//
//	kubevisor-deviceplugins [--handler-config /etc/kubevisor/handler.d] [--plugin-bin-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/deviceplugins"
)

const usage = `usage: kubevisor-deviceplugins [flags]

Advertises the devices of the node's device driver to the kubelet as extended resources
devices.kubevisor.io/<resource>, one kubelet device plugin per resource the driver declares.
The driver is the one the handler's configuration names (drivers.device, with
driverConfig.<name> as its configuration), started here through the plugin host: from the
handler configuration's pluginDir, or kubevisor-driver-<name> in --plugin-bin-dir. Needs root:
the sockets live in the kubelet's root-only device plugin directory.

Flags:
`

func main() {
	fs := flag.NewFlagSet("kubevisor-deviceplugins", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	handlerConfig := fs.String("handler-config", "/etc/kubevisor/handler.d", "the handler's configuration (a file, or a directory of parts)")
	pluginBinDir := fs.String("plugin-bin-dir", "", "directory whose kubevisor-driver-<name> binaries are the configured drivers (digests computed at start)")
	stateDir := fs.String("state-dir", "/run/kubevisor-deviceplugins", "the plugin host's root-only state directory (not the handler's)")
	pluginDir := fs.String("plugin-dir", deviceplugins.DefaultPluginDir, "kubelet device plugin directory (holds kubelet.sock)")
	poll := fs.Duration("health-poll-interval", deviceplugins.DefaultHealthPollInterval, "how often the sockets are checked besides fsnotify, and a driver without Watch is listed")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "the node's name, passed to the drivers (default $NODE_NAME)")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-deviceplugins", Level: hclog.LevelFromString(*logLevel), Output: os.Stderr, TimeFormat: time.RFC3339})

	hcfg, err := handler.LoadConfigPath(*handlerConfig)
	if err != nil {
		fail(2, err)
	}
	m, err := deviceManifest(hcfg, *pluginBinDir)
	if err != nil {
		fail(2, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	host, sources, err := deviceplugins.StartDrivers(ctx, plugin.HostConfig{StateDir: *stateDir, NodeName: *nodeName, Logger: logger}, []plugin.Manifest{m})
	if err != nil {
		fail(1, err)
	}
	code := 0
	cfg := deviceplugins.Config{PluginDir: *pluginDir, HealthPollInterval: metav1.Duration{Duration: *poll}}
	if mgr, err := deviceplugins.NewManager(ctx, cfg, sources, logger); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
		code = 2
	} else if err := mgr.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
		code = 1
	}
	if err := host.Close(); err != nil {
		logger.Warn("stop device drivers", "error", err)
	}
	os.Exit(code)
}

// deviceManifest is the manifest of the handler configuration's device driver, from binDir
// (kubevisor-driver-<name>) or else from the configuration's plugin directory, with the
// configuration's driverConfig for it.
func deviceManifest(c handler.Config, binDir string) (plugin.Manifest, error) {
	name := c.Drivers.Device
	if name == "" {
		return plugin.Manifest{}, fmt.Errorf("the handler configuration names no device driver (drivers.device)")
	}
	var m plugin.Manifest
	if binDir != "" {
		if _, err := os.Stat(filepath.Join(binDir, handler.DriverBinaryPrefix+name)); err == nil {
			ms, err := handler.DriverSet{Device: name}.Manifests(binDir)
			if err != nil {
				return plugin.Manifest{}, err
			}
			m = ms[0]
		}
	}
	if m.Name == "" && c.PluginDir != "" {
		found, err := plugin.Discover(c.PluginDir)
		if err != nil {
			return plugin.Manifest{}, fmt.Errorf("plugin directory %s: %w", c.PluginDir, err)
		}
		for _, f := range found {
			if f.Name == name {
				m = f
			}
		}
	}
	switch {
	case m.Name == "":
		return plugin.Manifest{}, fmt.Errorf("device driver %q is not installed: no %s%s in --plugin-bin-dir %q, no manifest of that name in pluginDir %q", name, handler.DriverBinaryPrefix, name, binDir, c.PluginDir)
	case m.Kind != driver.KindDevice:
		return plugin.Manifest{}, fmt.Errorf("driver %q is a %s driver, configured as the device driver", name, m.Kind)
	}
	if raw, ok := c.DriverConfig[name]; ok {
		m.Config = raw
	}
	return m, nil
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
	os.Exit(code)
}
