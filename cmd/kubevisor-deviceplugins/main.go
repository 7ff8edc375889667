// Command kubevisor-deviceplugins runs Kubevisor's kubelet device plugins (package deviceplugins) on a node:
//
//	kubevisor-deviceplugins [--devices kvm,tun,vhost-net,sev] [--slots 110] [--pci 10de:1eb8[=name]]...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/deviceplugins"
)

const usage = `usage: kubevisor-deviceplugins [flags]

Advertises host devices to the kubelet as extended resources: /dev/kvm, /dev/net/tun,
/dev/vhost-net and /dev/sev (AMD SEV hosts; unhealthy elsewhere) as
devices.kubevisor.io/{kvm,tun,vhost-net,sev}, each shareable by --slots pods, and
the PCI functions bound to vfio-pci with the IDs given by --pci. Needs root: the sockets live in
the kubelet's root-only device plugin directory. A --config file (YAML or JSON, the fields of
deviceplugins.Config) is read first; flags given on the command line override it.

Flags:
`

// pciFlags collects repeated --pci vendor:device[=resource] flags.
type pciFlags []deviceplugins.PCISelector

func (p *pciFlags) String() string { return fmt.Sprint(*p) }

func (p *pciFlags) Set(v string) error {
	ids, name, _ := strings.Cut(v, "=")
	vendor, device, ok := strings.Cut(ids, ":")
	if !ok {
		return fmt.Errorf("%q: want vendor:device[=resource]", v)
	}
	*p = append(*p, deviceplugins.PCISelector{Vendor: vendor, Device: device, ResourceName: name})
	return nil
}

func main() {
	fs := flag.NewFlagSet("kubevisor-deviceplugins", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	configFile := fs.String("config", "", "configuration file (YAML or JSON)")
	pluginDir := fs.String("plugin-dir", deviceplugins.DefaultPluginDir, "kubelet device plugin directory (holds kubelet.sock)")
	devRoot := fs.String("dev-root", "/", "where the host's /dev is found, for health checks")
	sysfsRoot := fs.String("sysfs-root", "/sys", "the host's sysfs, for VFIO discovery")
	poll := fs.Duration("health-poll-interval", deviceplugins.DefaultHealthPollInterval, "how often device health is re-read besides fsnotify")
	devices := fs.String("devices", "kvm,tun,vhost-net,sev", "character devices to advertise, comma-separated (empty for none)")
	slots := fs.Int("slots", deviceplugins.DefaultSlots, "pods that may share each character device")
	var pci pciFlags
	fs.Var(&pci, "pci", "vendor:device[=resource] of VFIO PCI devices to advertise (repeatable); default resource pci-<vendor>-<device>")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}

	cfg := deviceplugins.DefaultConfig()
	if *configFile != "" {
		b, err := os.ReadFile(*configFile)
		if err == nil {
			cfg = deviceplugins.Config{}
			err = yaml.UnmarshalStrict(b, &cfg)
		}
		if err != nil {
			fail(2, fmt.Errorf("config: %w", err))
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["plugin-dir"] || cfg.PluginDir == "" {
		cfg.PluginDir = *pluginDir
	}
	if set["dev-root"] || cfg.DevRoot == "" {
		cfg.DevRoot = *devRoot
	}
	if set["sysfs-root"] || cfg.SysfsRoot == "" {
		cfg.SysfsRoot = *sysfsRoot
	}
	if set["health-poll-interval"] || cfg.HealthPollInterval.Duration == 0 {
		cfg.HealthPollInterval.Duration = *poll
	}
	if set["devices"] {
		want := strings.FieldsFunc(*devices, func(r rune) bool { return r == ',' })
		var chars []deviceplugins.CharDevice
		for _, d := range deviceplugins.DefaultConfig().CharDevices {
			if slices.Contains(want, filepath.Base(d.ResourceName)) {
				chars = append(chars, d)
				want = slices.DeleteFunc(want, func(w string) bool { return w == filepath.Base(d.ResourceName) })
			}
		}
		if len(want) > 0 {
			fail(2, fmt.Errorf("--devices: unknown %s (known: kvm, tun, vhost-net, sev)", strings.Join(want, ", ")))
		}
		cfg.CharDevices = chars
	}
	if set["slots"] {
		for i := range cfg.CharDevices {
			cfg.CharDevices[i].Slots = *slots
		}
	}
	if set["pci"] {
		cfg.PCIDevices = pci
	}

	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-deviceplugins", Level: hclog.LevelFromString(*logLevel), Output: os.Stderr, TimeFormat: time.RFC3339})
	m, err := deviceplugins.NewManager(cfg, logger)
	if err != nil {
		fail(2, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := m.Run(ctx); err != nil {
		fail(1, err)
	}
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "kubevisor-deviceplugins:", err)
	os.Exit(code)
}
