package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// Defaults of Config.
const (
	DefaultStateDir     = "/var/lib/kubevisor"
	DefaultRunDir       = "/run/kubevisor/vmis"
	DefaultPluginDir    = "/etc/kubevisor/plugins"
	DefaultResyncPeriod = 30 * time.Second
	// DefaultGuestAgentPollInterval is how often the guest agent of every running VM is asked,
	// as KubeVirt's agent poller asks for the guest's OS info.
	DefaultGuestAgentPollInterval = 10 * time.Second
)

// Config is the handler's configuration file (YAML or JSON):
//
//	pluginDir: /etc/kubevisor/plugins      # driver manifests (plugin.Discover)
//	stateDir: /var/lib/kubevisor           # root-only: plugin reattach records, per-VMI state
//	runDir: /run/kubevisor/vmis            # per-VMI run directories (sockets, logs)
//	nodeName: node-1
//	drivers: {hypervisor: qmp, network: cni, storage: local, device: hostdev}
//	# or several hypervisor drivers, the first the default, and several device drivers:
//	# drivers: {hypervisors: [qmp, libvirt], network: cni, storage: local, devices: [hostdev, sim]}
//	driverConfig:                          # replaces a manifest's config, by driver name
//	  qmp: {disableKVM: true}
//	acceleration: auto                     # auto | required | emulated
//
// Relative paths are taken from the directory of the file.
type Config struct {
	// PluginDir holds the manifests of the installed drivers. Default: DefaultPluginDir.
	PluginDir string `json:"pluginDir,omitempty"`
	// StateDir is the handler's root-only state directory (0700): the plugin host's reattach
	// records and sockets, and vmis/<uid>.json per VMI. Default: DefaultStateDir.
	StateDir string `json:"stateDir,omitempty"`
	// RunDir holds a run directory per VMI (<RunDir>/<uid>, 0700), the domain spec's run_dir.
	// Default: DefaultRunDir.
	RunDir string `json:"runDir,omitempty"`
	// VolumeDir holds the storage driver's work directory per VMI (<VolumeDir>/<uid>).
	// Default: <StateDir>/volumes.
	VolumeDir string `json:"volumeDir,omitempty"`
	// NodeName is the node's name: the VMIs' status.nodeName, and passed to every driver.
	NodeName string `json:"nodeName,omitempty"`
	// Drivers names the installed drivers this node uses (a manifest's name): one or more
	// hypervisor drivers, any number of device drivers, one network and one storage driver.
	// Device drivers are optional; the others are required to run a VMI.
	Drivers DriverSet `json:"drivers"`
	// DriverConfig replaces the configuration of a driver's manifest, by driver name.
	DriverConfig map[string]json.RawMessage `json:"driverConfig,omitempty"`
	// Acceleration is the acceleration policy of the VMs: auto (default), required or emulated.
	Acceleration string `json:"acceleration,omitempty"`
	// DiskBus and CDROMBus are the buses of disks and cdroms whose VMI names none (default
	// virtio and sata, as KubeVirt's).
	DiskBus  string `json:"diskBus,omitempty"`
	CDROMBus string `json:"cdromBus,omitempty"`
	// Images maps container image references (containerDisk, kernelBoot) to their content on
	// this node: a disk image file, or a directory (an unpacked image or an OCI image layout).
	// Without a cluster nothing pulls images; a reference that is itself a path (absolute, or
	// starting with ./ or ../) is used as it is.
	Images map[string]string `json:"images,omitempty"`
	// Claims maps PersistentVolumeClaim names ("name" or "namespace/name") to their disk image
	// or block device on this node.
	Claims map[string]string `json:"claims,omitempty"`
	// ResyncPeriod is how often the handler asks the hypervisor driver for the status of every
	// VM, besides following its events. Default: DefaultResyncPeriod.
	ResyncPeriod metav1.Duration `json:"resyncPeriod,omitzero"`
	// GuestAgentPollInterval is how often the handler asks the hypervisor driver what the guest
	// agent of every running VM reports (driver.GuestAgent), besides shortly after each start;
	// the VMI's guestOSInfo and AgentConnected condition are written when the answer changes.
	// Default: DefaultGuestAgentPollInterval.
	GuestAgentPollInterval metav1.Duration `json:"guestAgentPollInterval,omitzero"`
	// Standalone configures `kubevisor-handler run` (package core/handler/standalone).
	Standalone *StandaloneConfig `json:"standalone,omitempty"`
}

// DriverSet names the drivers of a node: one network and one storage driver, one or more
// hypervisor drivers and any number of device drivers. Each VMI runs with the hypervisor driver
// its HypervisorClass names (status.hypervisorDriver, v1alpha1.VirtualMachineInstanceStatus),
// or with the node's default hypervisor driver (DefaultHypervisor) when it names none. Each
// device resource of a VMI's sandbox is allocated by the one device driver that lists it in
// its capabilities' resources; two device drivers listing one resource is an error naming both.
type DriverSet struct {
	// Hypervisor is a hypervisor driver: the node's default one when it is set.
	Hypervisor string `json:"hypervisor,omitempty"`
	// Hypervisors are the node's hypervisor drivers besides Hypervisor, in order; the first
	// of them is the default when Hypervisor is empty.
	Hypervisors []string `json:"hypervisors,omitempty"`
	Network     string   `json:"network,omitempty"`
	Storage     string   `json:"storage,omitempty"`
	// Device is a device driver of the node (the single device driver of older
	// configurations); Devices are its device drivers besides Device, in order. They add up:
	// DeviceNames.
	Device  string   `json:"device,omitempty"`
	Devices []string `json:"devices,omitempty"`
}

// DeviceNames returns the configured device drivers, Device first, each once.
func (s DriverSet) DeviceNames() []string {
	var out []string
	for _, name := range append([]string{s.Device}, s.Devices...) {
		if name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// withDevices returns s with the device drivers names, the first as Device.
func (s DriverSet) withDevices(names []string) DriverSet {
	s.Device, s.Devices = "", nil
	if len(names) > 0 {
		s.Device = names[0]
	}
	if len(names) > 1 {
		s.Devices = slices.Clone(names[1:])
	}
	return s
}

// HypervisorNames returns the configured hypervisor drivers, the default first, each once.
func (s DriverSet) HypervisorNames() []string {
	var out []string
	for _, name := range append([]string{s.Hypervisor}, s.Hypervisors...) {
		if name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// DefaultHypervisor is the hypervisor driver of a VMI that names none: Hypervisor, else the
// first of Hypervisors; "" when none is configured.
func (s DriverSet) DefaultHypervisor() string {
	if names := s.HypervisorNames(); len(names) > 0 {
		return names[0]
	}
	return ""
}

// withHypervisors returns s with the hypervisor drivers names, the first as Hypervisor.
func (s DriverSet) withHypervisors(names []string) DriverSet {
	s.Hypervisor, s.Hypervisors = "", nil
	if len(names) > 0 {
		s.Hypervisor = names[0]
	}
	if len(names) > 1 {
		s.Hypervisors = slices.Clone(names[1:])
	}
	return s
}

// kindName is one configured driver.
type kindName struct{ kind, name string }

// all returns the configured drivers: the hypervisor drivers in order, then network, storage
// and the device drivers in order.
func (s DriverSet) all() []kindName {
	var out []kindName
	for _, name := range s.HypervisorNames() {
		out = append(out, kindName{driver.KindHypervisor, name})
	}
	for _, d := range []kindName{{driver.KindNetwork, s.Network}, {driver.KindStorage, s.Storage}} {
		if d.name != "" {
			out = append(out, d)
		}
	}
	for _, name := range s.DeviceNames() {
		out = append(out, kindName{driver.KindDevice, name})
	}
	return out
}

// of returns the driver configured for a kind: for hypervisor drivers, the default one; for
// device drivers, the first.
func (s DriverSet) of(kind string) string {
	switch kind {
	case driver.KindHypervisor:
		return s.DefaultHypervisor()
	case driver.KindNetwork:
		return s.Network
	case driver.KindStorage:
		return s.Storage
	case driver.KindDevice:
		if names := s.DeviceNames(); len(names) > 0 {
			return names[0]
		}
	}
	return ""
}

// check says what is inconsistent in s: one driver name configured for two kinds.
func (s DriverSet) check() error {
	kinds := map[string]string{}
	var errs []error
	for _, d := range s.all() {
		if k, ok := kinds[d.name]; ok {
			errs = append(errs, fmt.Errorf("drivers: %q is configured as a %s and a %s driver", d.name, k, d.kind))
			continue
		}
		kinds[d.name] = d.kind
	}
	return errors.Join(errs...)
}

// StandaloneConfig is how `kubevisor-handler run` makes a VMI's sandbox without a cluster: a
// network namespace whose eth0 is on a host bridge (the reference CNI bridge and host-local
// plugins), with a kubevisor-launcher in it.
type StandaloneConfig struct {
	// SandboxDir holds each VMI's launcher directory (<SandboxDir>/<uid>, 0700). Default:
	// /run/kubevisor/sandboxes.
	SandboxDir string `json:"sandboxDir,omitempty"`
	// Launcher is the kubevisor-launcher binary. Default: next to kubevisor-handler, else PATH.
	Launcher string `json:"launcher,omitempty"`
	// CNIBinDir are the directories searched for the CNI plugins bridge and host-local.
	// Default: _output/cni/bin of the repository kubevisor-handler was built in (../_output/cni/bin
	// from its directory), /opt/cni/bin, /usr/lib/cni.
	CNIBinDir []string `json:"cniBinDir,omitempty"`
	// Bridge is the host bridge of the "pod network". Default: kv-standalone0.
	Bridge string `json:"bridge,omitempty"`
	// Subnet is the pod network's IPv4 subnet; the bridge takes its first address. Default:
	// 10.244.255.0/24.
	Subnet string `json:"subnet,omitempty"`
	// BypassLauncher leaves the launcher's socket out of the domain spec, so that the hypervisor
	// driver starts the VM process itself, in the sandbox's network namespace, for a driver
	// that takes no launcher socket. By default the VM process is the launcher's child, as in a
	// cluster: it dies with the launcher.
	BypassLauncher bool `json:"bypassLauncher,omitempty"`
	// CPUs are the host CPUs each sandbox's launcher, and so its VM process, runs on (as a
	// launcher pod's cpuset): a VMI with cpu.dedicatedCpuPlacement has its vCPUs pinned onto
	// the first of them, and with isolateEmulatorThread its emulator onto the next. Nothing
	// keeps other processes off them. Default: the handler's CPUs.
	CPUs []uint32 `json:"cpus,omitempty"`
}

// LoadConfig reads a configuration file strictly (an unknown field is an error) and resolves
// its relative paths against the file's directory. Defaults are not filled in.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("handler config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Config{}, fmt.Errorf("handler config: %w", err)
	}
	c, err := parseConfig(data, filepath.Dir(abs))
	if err != nil {
		return Config{}, fmt.Errorf("handler config %s: %w", path, err)
	}
	return c, nil
}

// parseConfig decodes a configuration file's data strictly and resolves its relative paths
// against dir, the file's directory.
func parseConfig(data []byte, dir string) (Config, error) {
	var c Config
	if err := DecodeStrict(data, &c); err != nil {
		return Config{}, err
	}
	c.resolve(dir)
	return c, nil
}

// resolve makes the configuration's relative paths absolute against dir.
func (c *Config) resolve(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&c.PluginDir)
	abs(&c.StateDir)
	abs(&c.RunDir)
	abs(&c.VolumeDir)
	for k, v := range c.Images {
		abs(&v)
		c.Images[k] = v
	}
	for k, v := range c.Claims {
		abs(&v)
		c.Claims[k] = v
	}
	if s := c.Standalone; s != nil {
		abs(&s.SandboxDir)
		if strings.ContainsRune(s.Launcher, '/') {
			abs(&s.Launcher)
		}
		for i := range s.CNIBinDir {
			abs(&s.CNIBinDir[i])
		}
	}
}

// withDefaults fills in the defaults and checks c.
func (c Config) withDefaults() (Config, error) {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.VolumeDir == "" {
		c.VolumeDir = filepath.Join(c.StateDir, "volumes")
	}
	if c.ResyncPeriod.Duration <= 0 {
		c.ResyncPeriod.Duration = DefaultResyncPeriod
	}
	if c.GuestAgentPollInterval.Duration <= 0 {
		c.GuestAgentPollInterval.Duration = DefaultGuestAgentPollInterval
	}
	var errs []error
	for field, p := range map[string]string{"stateDir": c.StateDir, "runDir": c.RunDir, "volumeDir": c.VolumeDir} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s: must be an absolute path, not %q", field, p))
		}
	}
	if err := c.Drivers.check(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.acceleration(); err != nil {
		errs = append(errs, err)
	}
	for field, bus := range map[string]string{"diskBus": c.DiskBus, "cdromBus": c.CDROMBus} {
		if _, err := parseBus(bus); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	for name, raw := range c.DriverConfig {
		if !json.Valid(raw) {
			errs = append(errs, fmt.Errorf("driverConfig.%s: not valid JSON", name))
		}
	}
	return c, errors.Join(errs...)
}

func (c Config) acceleration() (domainv1.Acceleration, error) {
	switch c.Acceleration {
	case "", "auto":
		return domainv1.Acceleration_ACCELERATION_AUTO, nil
	case "required":
		return domainv1.Acceleration_ACCELERATION_REQUIRED, nil
	case "emulated":
		return domainv1.Acceleration_ACCELERATION_EMULATED, nil
	}
	return 0, fmt.Errorf("acceleration: %q is not auto, required or emulated", c.Acceleration)
}

func parseBus(bus string) (domainv1.DiskBus, error) {
	switch bus {
	case "":
		return domainv1.DiskBus_DISK_BUS_UNSPECIFIED, nil
	case "virtio":
		return domainv1.DiskBus_DISK_BUS_VIRTIO, nil
	case "sata":
		return domainv1.DiskBus_DISK_BUS_SATA, nil
	case "scsi":
		return domainv1.DiskBus_DISK_BUS_SCSI, nil
	case "usb":
		return domainv1.DiskBus_DISK_BUS_USB, nil
	}
	return 0, fmt.Errorf("%q is not virtio, sata, scsi or usb", bus)
}
