// Package deviceplugins hands host devices (/dev/kvm, /dev/net/tun, /dev/vhost-net and VFIO PCI devices) to launcher pods through kubelet device plugins.
package deviceplugins

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Defaults of Config.
const (
	// DefaultPluginDir is where the kubelet looks for device plugin sockets and serves kubelet.sock.
	DefaultPluginDir = pluginapi.DevicePluginPath
	// DefaultSlots is how many pods may hold a shared character device at once: the kubelet's
	// default maximum of pods per node, so the slots never run out before the node's pods do.
	DefaultSlots = 110
	// DefaultHealthPollInterval bounds how late a change fsnotify cannot see (sysfs rebinding,
	// a missed event) reaches the kubelet.
	DefaultHealthPollInterval = 10 * time.Second
	// KubeletSocketName is the kubelet's registration socket inside the plugin directory.
	KubeletSocketName = "kubelet.sock"
	// VFIODriver is the kernel driver a PCI device must be bound to before it can be passed through.
	VFIODriver = "vfio-pci"
	// PCIResourceEnvPrefix starts the environment variable that lists the PCI addresses a
	// container got, as in KubeVirt (see PCIResourceEnvVar).
	PCIResourceEnvPrefix = "PCI_RESOURCE"
)

// Config says which device plugins a node runs and where the host's files are.
type Config struct {
	// PluginDir is the kubelet's device plugin directory: the plugins' sockets are created in it
	// and the kubelet's registration socket (kubelet.sock) is dialled there. It is root-only on a
	// node, which is what keeps the sockets away from pods. Default DefaultPluginDir.
	PluginDir string `json:"pluginDir,omitempty"`
	// DevRoot is where the host's /dev is looked up for health checks ("/" on the host, or
	// wherever the host's root is mounted in a container). DeviceSpecs always carry the host
	// paths themselves (/dev/kvm), since the container runtime resolves them on the host.
	// Default "/".
	DevRoot string `json:"devRoot,omitempty"`
	// SysfsRoot is the host's sysfs, where VFIO PCI devices are discovered. Default "/sys".
	SysfsRoot string `json:"sysfsRoot,omitempty"`
	// HealthPollInterval is how often device health is re-read besides the fsnotify events.
	// Default DefaultHealthPollInterval.
	HealthPollInterval metav1.Duration `json:"healthPollInterval,omitzero"`
	// CharDevices are the shared character devices to advertise.
	CharDevices []CharDevice `json:"charDevices,omitempty"`
	// PCIDevices select the VFIO PCI devices to advertise.
	PCIDevices []PCISelector `json:"pciDevices,omitempty"`
}

// CharDevice is a character device that many pods may use at once, advertised as Slots
// interchangeable kubelet devices.
type CharDevice struct {
	// ResourceName is the extended resource; a name without "/" gets DeviceResourcePrefix.
	ResourceName string `json:"resourceName"`
	// Path is the device node on the host, e.g. /dev/kvm.
	Path string `json:"path"`
	// Slots is how many containers may hold the device at once. Default DefaultSlots.
	Slots int `json:"slots,omitempty"`
	// Permissions are the cgroup device permissions granted ("rw", "rwm"). Default "rw".
	Permissions string `json:"permissions,omitempty"`
}

// PCISelector chooses the PCI devices bound to vfio-pci with one vendor:device ID.
type PCISelector struct {
	// Vendor is the PCI vendor ID in hex, e.g. "10de".
	Vendor string `json:"vendor"`
	// Device is the PCI device ID in hex, e.g. "1eb8".
	Device string `json:"device"`
	// ResourceName is the extended resource; a name without "/" gets DeviceResourcePrefix.
	// Default pci-<vendor>-<device>. Selectors naming the same resource share one plugin.
	ResourceName string `json:"resourceName,omitempty"`
}

// DefaultConfig returns the configuration for the devices every VM node needs: /dev/kvm,
// /dev/net/tun and /dev/vhost-net with DefaultSlots each, /dev/sev (unhealthy, so none
// allocatable, where the host has no SEV), and no PCI devices. All four are
// granted "rw" only: the runtime creates the node in the container, and nothing in a launcher
// needs to mknod it again ("m"), which a configuration can still grant per device.
func DefaultConfig() Config {
	return Config{
		CharDevices: []CharDevice{
			{ResourceName: v1alpha1.KVMDeviceResource, Path: "/dev/kvm", Permissions: "rw"},
			{ResourceName: v1alpha1.TunDeviceResource, Path: "/dev/net/tun", Permissions: "rw"},
			{ResourceName: v1alpha1.VhostNetDeviceResource, Path: "/dev/vhost-net", Permissions: "rw"},
			// Healthy only on AMD hosts with SEV enabled: launchSecurity.sev VMIs ask for it.
			{ResourceName: v1alpha1.SEVDeviceResource, Path: "/dev/sev", Permissions: "rw"},
		},
	}
}

// withDefaults fills the fields left empty.
func (c Config) withDefaults() Config {
	if c.PluginDir == "" {
		c.PluginDir = DefaultPluginDir
	}
	if c.DevRoot == "" {
		c.DevRoot = "/"
	}
	if c.SysfsRoot == "" {
		c.SysfsRoot = "/sys"
	}
	if c.HealthPollInterval.Duration <= 0 {
		c.HealthPollInterval.Duration = DefaultHealthPollInterval
	}
	chars := make([]CharDevice, len(c.CharDevices))
	for i, d := range c.CharDevices {
		d.ResourceName = qualify(d.ResourceName)
		if d.Slots == 0 {
			d.Slots = DefaultSlots
		}
		if d.Permissions == "" {
			d.Permissions = "rw"
		}
		chars[i] = d
	}
	c.CharDevices = chars
	pcis := make([]PCISelector, len(c.PCIDevices))
	for i, s := range c.PCIDevices {
		s.Vendor = normalizeID(s.Vendor)
		s.Device = normalizeID(s.Device)
		if s.ResourceName == "" {
			s.ResourceName = "pci-" + s.Vendor + "-" + s.Device
		}
		s.ResourceName = qualify(s.ResourceName)
		pcis[i] = s
	}
	c.PCIDevices = pcis
	return c
}

var (
	hexID = regexp.MustCompile(`^[0-9a-f]{4}$`)
	// resourceNameRE is what the kubelet accepts as an extended resource name: a DNS subdomain
	// prefix other than kubernetes.io and a name of at most 63 characters.
	resourceNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
)

// validate reports every problem of a defaulted configuration.
func (c Config) validate() error {
	var errs []error
	if !filepath.IsAbs(c.PluginDir) {
		errs = append(errs, fmt.Errorf("pluginDir %q: not an absolute path", c.PluginDir))
	}
	seen := map[string]bool{}
	for i, d := range c.CharDevices {
		if !resourceNameRE.MatchString(d.ResourceName) || strings.HasPrefix(d.ResourceName, "kubernetes.io/") {
			errs = append(errs, fmt.Errorf("charDevices[%d].resourceName %q: not an extended resource name", i, d.ResourceName))
		}
		if seen[d.ResourceName] {
			errs = append(errs, fmt.Errorf("charDevices[%d].resourceName %q: used twice", i, d.ResourceName))
		}
		seen[d.ResourceName] = true
		if !filepath.IsAbs(d.Path) {
			errs = append(errs, fmt.Errorf("charDevices[%d].path %q: not an absolute path", i, d.Path))
		}
		if d.Slots < 1 {
			errs = append(errs, fmt.Errorf("charDevices[%d].slots %d: must be at least 1", i, d.Slots))
		}
		if strings.Trim(d.Permissions, "rwm") != "" {
			errs = append(errs, fmt.Errorf("charDevices[%d].permissions %q: only r, w and m are allowed", i, d.Permissions))
		}
	}
	for i, s := range c.PCIDevices {
		if !hexID.MatchString(s.Vendor) || !hexID.MatchString(s.Device) {
			errs = append(errs, fmt.Errorf("pciDevices[%d]: vendor:device %q:%q: want four hex digits each", i, s.Vendor, s.Device))
		}
		if !resourceNameRE.MatchString(s.ResourceName) || strings.HasPrefix(s.ResourceName, "kubernetes.io/") {
			errs = append(errs, fmt.Errorf("pciDevices[%d].resourceName %q: not an extended resource name", i, s.ResourceName))
		}
		if seen[s.ResourceName] {
			errs = append(errs, fmt.Errorf("pciDevices[%d].resourceName %q: already a character device", i, s.ResourceName))
		}
	}
	return errors.Join(errs...)
}

// qualify puts a bare name under DeviceResourcePrefix.
func qualify(name string) string {
	if name == "" || strings.Contains(name, "/") {
		return name
	}
	return v1alpha1.DeviceResourcePrefix + name
}

// normalizeID turns "0x10DE" and "10de" alike into sysfs's lowercase form without the prefix.
func normalizeID(id string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(id)), "0x")
}

// PCIResourceEnvVar names the environment variable that lists, comma-separated, the PCI
// addresses a container was allocated for resourceName: KubeVirt's naming
// (PCI_RESOURCE_<resource upper-cased, "/" and "." as "_">), with "-" also turned into "_" so
// that a shell can read it.
func PCIResourceEnvVar(resourceName string) string {
	r := strings.NewReplacer("/", "_", ".", "_", "-", "_")
	return PCIResourceEnvPrefix + "_" + r.Replace(strings.ToUpper(resourceName))
}
