package hostdev

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

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

// PermittedHostDevices is KubeVirt's permittedHostDevices, the part this driver offers.
type PermittedHostDevices struct {
	// PCIHostDevices select PCI functions by vendor:device.
	PCIHostDevices []PCIHostDevice `json:"pciHostDevices,omitempty"`
}

// PCIHostDevice selects the PCI functions of one vendor:device ID that are bound to vfio-pci,
// one device per function (its PCI address). Entries naming the same resource share it.
type PCIHostDevice struct {
	// PCIVendorSelector is "vendor:device" in hex, e.g. "10DE:1EB8".
	PCIVendorSelector string `json:"pciVendorSelector"`
	// ResourceName is the resource: "gpu-t4" or "devices.kubevisor.io/gpu-t4" (the kubelet
	// device plugins serve devices.kubevisor.io/ only).
	ResourceName string `json:"resourceName"`
}

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

var (
	hexID = regexp.MustCompile(`^[0-9a-f]{4}$`)
	// resourceRE is a resource name as the device contract has it (lowercase: a DNS label
	// with dots), which the kubelet takes as the name part of an extended resource.
	resourceRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

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
	resource := func(field, name string) string {
		r := bare(name)
		switch {
		case strings.Contains(r, "/"):
			errs = append(errs, fmt.Errorf("%s.resourceName %q: the device plugins serve %s<name> only", field, name, v1alpha1.DeviceResourcePrefix))
		case !resourceRE.MatchString(r):
			errs = append(errs, fmt.Errorf("%s.resourceName %q: not a resource name (lowercase letters, digits, '-' and '.', at most 63)", field, name))
		}
		return r
	}
	for i, d := range chars {
		field := fmt.Sprintf("config.charDevices[%d]", i)
		d.ResourceName = resource(field, d.ResourceName)
		if prev, ok := seen[d.ResourceName]; ok {
			errs = append(errs, fmt.Errorf("%s.resourceName %q: already used by %s", field, d.ResourceName, prev))
		}
		seen[d.ResourceName] = field
		if !filepath.IsAbs(d.Path) {
			errs = append(errs, fmt.Errorf("%s.path %q: not an absolute path", field, d.Path))
		}
		if d.Slots == 0 {
			d.Slots = DefaultSlots
		}
		if d.Slots < 1 || d.Slots > 1<<16 {
			errs = append(errs, fmt.Errorf("%s.slots %d: must be between 1 and 65536", field, d.Slots))
		}
		if d.Permissions == "" {
			d.Permissions = "rw"
		}
		if strings.Trim(d.Permissions, "rwm") != "" {
			errs = append(errs, fmt.Errorf("%s.permissions %q: only r, w and m are allowed", field, d.Permissions))
		}
		s.chars = append(s.chars, d)
	}
	pciField := map[string]bool{}
	selectorAt := map[string]string{} // vendor:device → field
	for i, p := range c.PermittedHostDevices.PCIHostDevices {
		field := fmt.Sprintf("config.permittedHostDevices.pciHostDevices[%d]", i)
		vendor, device, ok := strings.Cut(p.PCIVendorSelector, ":")
		sel := pciSelector{index: i, vendor: normalizeID(vendor), device: normalizeID(device)}
		if !ok || !hexID.MatchString(sel.vendor) || !hexID.MatchString(sel.device) {
			errs = append(errs, fmt.Errorf("%s.pciVendorSelector %q: want vendor:device, four hex digits each (\"10DE:1EB8\")", field, p.PCIVendorSelector))
		}
		if prev, ok := selectorAt[sel.id()]; ok {
			errs = append(errs, fmt.Errorf("%s.pciVendorSelector %q: already selected by %s", field, p.PCIVendorSelector, prev))
		}
		selectorAt[sel.id()] = field
		if p.ResourceName == "" {
			errs = append(errs, fmt.Errorf("%s.resourceName: required", field))
		}
		sel.resource = resource(field, p.ResourceName)
		if prev, ok := seen[sel.resource]; ok && !pciField[sel.resource] {
			errs = append(errs, fmt.Errorf("%s.resourceName %q: already a character device (%s)", field, sel.resource, prev))
		}
		if _, ok := seen[sel.resource]; !ok {
			seen[sel.resource] = field
		}
		pciField[sel.resource] = true
		s.pci = append(s.pci, sel)
	}
	if err := errors.Join(errs...); err != nil {
		return settings{}, err
	}
	return s, nil
}
