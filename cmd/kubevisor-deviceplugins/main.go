// Command kubevisor-deviceplugins runs Kubevisor's kubelet device plugins (package deviceplugins)
// on a node, for every device driver the handler's configuration names, and gives its hostdev
// driver the live permitted host devices (core/liveconfig):
//
//	kubevisor-deviceplugins [--handler-config /etc/kubevisor/handler.d] [--plugin-bin-dir DIR]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/deviceplugins"
)

const usage = `usage: kubevisor-deviceplugins [flags]

Advertises the devices of the node's device drivers to the kubelet as extended resources
devices.kubevisor.io/<resource>, one kubelet device plugin per resource a driver declares (two
drivers declaring one resource is an error naming both). The drivers are those the handler's
configuration names (drivers.device and drivers.devices, with driverConfig.<name> as each one's
configuration), started here through the plugin host: kubevisor-driver-<name> in
--plugin-bin-dir, else the handler configuration's pluginDir. Needs root: the sockets live in
the kubelet's root-only device plugin directory.

With a hostdev driver it watches the live configuration ConfigMap (--live-config-name in
--live-config-namespace, with the pod's service account or --kubeconfig): its
permittedHostDevices replace those of driverConfig.hostdev while it has them, the driver is
configured again without a restart, and the plugins follow its resources (a resource no
longer permitted is withdrawn from the kubelet, a new one registered). Without an API server
to reach, the handler configuration alone applies.

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
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file for the live configuration (default: in-cluster, or $KUBECONFIG)")
	liveNamespace := fs.String("live-config-namespace", liveconfig.Namespace, "`namespace` of the live configuration ConfigMap")
	liveName := fs.String("live-config-name", liveconfig.Name, "`name` of the live configuration ConfigMap (core/liveconfig), whose permittedHostDevices replace driverConfig.hostdev's while it exists; \"\" turns it off")
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
	ms, err := deviceManifests(hcfg, *pluginBinDir)
	if err != nil {
		fail(2, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	host, sources, err := deviceplugins.StartDrivers(ctx, plugin.HostConfig{StateDir: *stateDir, NodeName: *nodeName, Logger: logger}, ms)
	if err != nil {
		fail(1, err)
	}
	code := 0
	cfg := deviceplugins.Config{PluginDir: *pluginDir, HealthPollInterval: metav1.Duration{Duration: *poll}}
	if mgr, err := deviceplugins.NewManager(ctx, cfg, sources, logger); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
		code = 2
	} else {
		var watching sync.WaitGroup
		if w := liveWatcher(ms, *liveNamespace, *liveName, *kubeconfig, *logLevel, logger); w != nil {
			hd := &deviceplugins.HostDevices{Host: host, Base: hostdevConfig(ms), Manager: mgr}
			w.Appliers = []liveconfig.Applier{liveconfig.HostDevices(ctx, hd.Set, w.Log)}
			watching.Go(func() { _ = w.Start(ctx) })
		}
		if err := mgr.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
			code = 1
		}
		stop() // the watcher too, when a plugin could not start
		watching.Wait()
	}
	if err := host.Close(); err != nil {
		logger.Warn("stop device drivers", "error", err)
	}
	os.Exit(code)
}

// liveWatcher is the watcher of the live configuration when the device drivers include the
// hostdev driver and name is set, nil otherwise; without an API server to reach it logs why and
// is nil.
func liveWatcher(ms []plugin.Manifest, namespace, name, kubeconfig, level string, logger hclog.Logger) *liveconfig.Watcher {
	if name == "" || !slices.ContainsFunc(ms, func(m plugin.Manifest) bool { return m.Name == liveconfig.HostDevicesDriver }) {
		return nil
	}
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = ctrlconfig.GetConfig()
	}
	var cs kubernetes.Interface
	if err == nil {
		cs, err = kubernetes.NewForConfig(rc)
	}
	if err != nil {
		logger.Warn("the live configuration is not watched: driverConfig."+liveconfig.HostDevicesDriver+" alone applies", "error", err)
		return nil
	}
	sl := &slog.LevelVar{}
	sl.Set(liveconfig.SlogLevel(hclog.LevelFromString(level)))
	log := logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: sl})).WithName("liveconfig")
	return &liveconfig.Watcher{Client: cs, Namespace: namespace, Name: name, Log: log}
}

// hostdevConfig is the configuration the hostdev driver is started with (the handler
// configuration's driverConfig.hostdev, or its manifest's).
func hostdevConfig(ms []plugin.Manifest) json.RawMessage {
	for _, m := range ms {
		if m.Name == liveconfig.HostDevicesDriver {
			return m.Config
		}
	}
	return nil
}

// deviceManifests are the manifests of the handler configuration's device drivers, in order
// (deviceManifest); the error names every one missing.
func deviceManifests(c handler.Config, binDir string) ([]plugin.Manifest, error) {
	names := c.Drivers.DeviceNames()
	if len(names) == 0 {
		return nil, fmt.Errorf("the handler configuration names no device driver (drivers.device, drivers.devices)")
	}
	var out []plugin.Manifest
	var errs []error
	for _, name := range names {
		m, err := deviceManifest(c, name, binDir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

// deviceManifest is the manifest of the device driver name, from binDir
// (kubevisor-driver-<name>) or else from the configuration's plugin directory, with the
// configuration's driverConfig for it.
func deviceManifest(c handler.Config, name, binDir string) (plugin.Manifest, error) {
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
		return plugin.Manifest{}, fmt.Errorf("driver %q is a %s driver, configured as a device driver", name, m.Kind)
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
