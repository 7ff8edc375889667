package hostdev

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Defaults of Config.
const (
	// DefaultSlots is how many pods may hold a shared character device at once: the kubelet's
	// default maximum of pods per node, so the slots never run out before the node's pods do.
	DefaultSlots = 110
	// DefaultPollInterval bounds how late a change fsnotify cannot see (sysfs rebinding, a
	// missed event) reaches Watch and Fingerprint.
	DefaultPollInterval = 10 * time.Second
)

// Config is the driver's JSON configuration: the manifest's config, or the handler's
// driverConfig.hostdev. Which host devices become which devices.kubevisor.io/<name> resource
// is said here, not in code:
//
//	{"charDevices": [{"resourceName": "kvm", "path": "/dev/kvm"}],
//	 "permittedHostDevices": {"pciHostDevices": [
//	   {"pciVendorSelector": "10DE:1EB8", "resourceName": "gpu-t4"}]}}
type Config struct {
	// DevRoot is where the host's /dev is looked up for health ("/" on the host, or wherever
	// the host's root is mounted in a container). Allocate always answers the host's own paths
	// (/dev/kvm), since the container runtime resolves them on the host. Default "/".
	DevRoot string `json:"devRoot,omitempty"`
	// SysfsRoot is the host's sysfs, where PCI devices are discovered. Default "/sys".
	SysfsRoot string `json:"sysfsRoot,omitempty"`
	// PollInterval is how often devices are read again besides the fsnotify events of their
	// device directories ("10s"). Default DefaultPollInterval.
	PollInterval string `json:"pollInterval,omitempty"`
	// CharDevices are the shared character devices. Absent (null) means DefaultCharDevices; an
	// empty list means none.
	CharDevices []CharDevice `json:"charDevices"`
	// PermittedHostDevices are the PCI devices passed through with VFIO, as KubeVirt's
	// spec.configuration.permittedHostDevices.
	PermittedHostDevices PermittedHostDevices `json:"permittedHostDevices,omitzero"`
}

// CharDevice is a character device that many pods may use at once, listed as Slots
// interchangeable devices "<node name>-<i>" ("kvm-0").
type CharDevice struct {
	// ResourceName is the resource: a name such as "kvm" (devices.kubevisor.io/kvm); the
	// prefix devices.kubevisor.io/ may be written.
	ResourceName string `json:"resourceName"`
	// Path is the device node on the host, e.g. /dev/kvm.
	Path string `json:"path"`
	// Slots is how many containers may hold the device at once. Default DefaultSlots.
	Slots int `json:"slots,omitempty"`
	// Permissions are the cgroup device permissions granted ("rw", "rwm"). Default "rw".
	Permissions string `json:"permissions,omitempty"`
}

// PermittedHostDevices is KubeVirt's permittedHostDevices, the part this driver offers: the
// API's type, which the live configuration (core/liveconfig) carries too.
type PermittedHostDevices = v1alpha1.PermittedHostDevices

// PCIHostDevice selects the PCI functions of one vendor:device ID (v1alpha1.PCIHostDevice).
type PCIHostDevice = v1alpha1.PCIHostDevice

// DefaultCharDevices are the devices every VM node needs: /dev/kvm, /dev/net/tun and
// /dev/vhost-net, and /dev/sev (unhealthy, so none allocatable, where the host has no SEV). All
// are granted "rw" only: the runtime creates the node in the container, and nothing in a
// launcher needs to mknod it again ("m"), which a configuration can still grant per device.
func DefaultCharDevices() []CharDevice {
	return []CharDevice{
		{ResourceName: bare(v1alpha1.KVMDeviceResource), Path: "/dev/kvm"},
		{ResourceName: bare(v1alpha1.TunDeviceResource), Path: "/dev/net/tun"},
		{ResourceName: bare(v1alpha1.VhostNetDeviceResource), Path: "/dev/vhost-net"},
		// Healthy only on AMD hosts with SEV enabled: launchSecurity.sev VMIs ask for it.
		{ResourceName: bare(v1alpha1.SEVDeviceResource), Path: "/dev/sev"},
	}
}

// bare strips devices.kubevisor.io/ from a resource name.
func bare(name string) string { return strings.TrimPrefix(name, v1alpha1.DeviceResourcePrefix) }

// settings is a Config decoded, defaulted and checked.
type settings struct {
	devRoot, sysfsRoot string
	poll               time.Duration
	chars              []CharDevice
	pci                []pciSelector
}

// pciSelector is a PCIHostDevice parsed.
type pciSelector struct {
	index          int // in permittedHostDevices.pciHostDevices
	vendor, device string
	resource       string
}

func (s pciSelector) id() string { return s.vendor + ":" + s.device }

// field names a selector in messages.
func (s pciSelector) field() string {
	return fmt.Sprintf("permittedHostDevices.pciHostDevices[%d] (%s, resource %s)", s.index, s.id(), s.resource)
}

// parseConfig decodes raw strictly (an unknown field, such as KubeVirt's mediatedDevices, is an
// error naming it), fills the defaults and reports every problem, each naming its field.
func parseConfig(raw []byte) (settings, error) {
	var c Config
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return settings{}, fmt.Errorf("config: %w", err)
		}
	}
	s := settings{devRoot: c.DevRoot, sysfsRoot: c.SysfsRoot, poll: DefaultPollInterval}
	var errs []error
	if s.devRoot == "" {
		s.devRoot = "/"
	}
	if s.sysfsRoot == "" {
		s.sysfsRoot = "/sys"
	}
	if !filepath.IsAbs(s.devRoot) {
		errs = append(errs, fmt.Errorf("config.devRoot %q: not an absolute path", s.devRoot))
	}
	if !filepath.IsAbs(s.sysfsRoot) {
		errs = append(errs, fmt.Errorf("config.sysfsRoot %q: not an absolute path", s.sysfsRoot))
	}
	if c.PollInterval != "" {
		d, err := time.ParseDuration(c.PollInterval)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("config.pollInterval %q: not a positive duration such as \"10s\"", c.PollInterval))
		}
		s.poll = d
	}
	chars := c.CharDevices
	if chars == nil {
		chars = DefaultCharDevices()
	}
	seen := map[string]string{} // resource → field that named it
	for i, d := range chars {
		at := fmt.Sprintf("config.charDevices[%d]", i)
		if err := v1alpha1.CheckDeviceResource(d.ResourceName); err != nil {
			errs = append(errs, fmt.Errorf("%s.resourceName %q: %w", at, d.ResourceName, err))
		}
		d.ResourceName = bare(d.ResourceName)
		if prev, ok := seen[d.ResourceName]; ok {
			errs = append(errs, fmt.Errorf("%s.resourceName %q: already used by %s", at, d.ResourceName, prev))
		}
		seen[d.ResourceName] = at
		if !filepath.IsAbs(d.Path) {
			errs = append(errs, fmt.Errorf("%s.path %q: not an absolute path", at, d.Path))
		}
		if d.Slots == 0 {
			d.Slots = DefaultSlots
		}
		if d.Slots < 1 || d.Slots > 1<<16 {
			errs = append(errs, fmt.Errorf("%s.slots %d: must be between 1 and 65536", at, d.Slots))
		}
		if d.Permissions == "" {
			d.Permissions = "rw"
		}
		if strings.Trim(d.Permissions, "rwm") != "" {
			errs = append(errs, fmt.Errorf("%s.permissions %q: only r, w and m are allowed", at, d.Permissions))
		}
		s.chars = append(s.chars, d)
	}
	// The selectors and resource names by the API's rule; a collision with a character
	// device only here, where they are known.
	for _, e := range c.PermittedHostDevices.Validate(field.NewPath("config", "permittedHostDevices")) {
		errs = append(errs, e)
	}
	for i, p := range c.PermittedHostDevices.PCIHostDevices {
		vendor, device, _ := p.Selector()
		sel := pciSelector{index: i, vendor: vendor, device: device, resource: p.Resource()}
		if prev, ok := seen[sel.resource]; ok && p.ResourceName != "" {
			errs = append(errs, fmt.Errorf("config.permittedHostDevices.pciHostDevices[%d].resourceName %q: already a character device (%s)", i, sel.resource, prev))
		}
		s.pci = append(s.pci, sel)
	}
	if err := errors.Join(errs...); err != nil {
		return settings{}, err
	}
	return s, nil
}

// fixedFields names the fields of the configuration in which s and o differ, besides
// permittedHostDevices: what a configured driver does not take live (Configure).
func (s settings) fixedFields(o settings) []string {
	var out []string
	if s.devRoot != o.devRoot {
		out = append(out, "config.devRoot")
	}
	if s.sysfsRoot != o.sysfsRoot {
		out = append(out, "config.sysfsRoot")
	}
	if s.poll != o.poll {
		out = append(out, "config.pollInterval")
	}
	if !slices.Equal(s.chars, o.chars) {
		out = append(out, "config.charDevices")
	}
	return out
}
