package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// PermittedHostDevices is KubeVirt's spec.configuration.permittedHostDevices, the part
// Kubevisor offers: which host PCI functions become which devices.kubevisor.io/<name>
// resource. It is the hostdev device driver's permittedHostDevices (drivers/hostdev Config),
// which a Kubevisor sets in spec.drivers[hostdev].config and the operator hands to the nodes
// through the live configuration (core/liveconfig), so that a change reaches the nodes without
// a restart. KubeVirt's mediatedDevices, usb and externalResourceProvider are not offered: a
// document naming them is refused by field.
type PermittedHostDevices struct {
	// PCIHostDevices select PCI functions by vendor:device.
	// +optional
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

var (
	hexID = regexp.MustCompile(`^[0-9a-f]{4}$`)
	// deviceResourceRE is a device resource's name without its domain, as the device contract
	// has it (lowercase: a DNS label with dots), which the kubelet takes as the name part of an
	// extended resource.
	deviceResourceRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

// Selector is the entry's vendor and device IDs, lowercase hex without "0x" ("10de",
// "1eb8"), and whether PCIVendorSelector is four hex digits each, colon-separated.
func (d PCIHostDevice) Selector() (vendor, device string, ok bool) {
	v, dev, found := strings.Cut(d.PCIVendorSelector, ":")
	vendor, device = normalizePCIID(v), normalizePCIID(dev)
	return vendor, device, found && hexID.MatchString(vendor) && hexID.MatchString(device)
}

// Resource is the entry's resource name without devices.kubevisor.io/ ("gpu-t4").
func (d PCIHostDevice) Resource() string {
	return strings.TrimPrefix(d.ResourceName, DeviceResourcePrefix)
}

func normalizePCIID(id string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(id)), "0x")
}

// CheckDeviceResource says why name cannot be a device resource of the kubelet device plugins:
// "kvm" or "devices.kubevisor.io/kvm"; another domain, or a name that is not lowercase
// letters, digits, '-' and '.', at most 63, is refused.
func CheckDeviceResource(name string) error {
	bare := strings.TrimPrefix(name, DeviceResourcePrefix)
	switch {
	case strings.Contains(bare, "/"):
		return fmt.Errorf("the device plugins serve %s<name> only", DeviceResourcePrefix)
	case !deviceResourceRE.MatchString(bare):
		return fmt.Errorf("not a resource name (lowercase letters, digits, '-' and '.', at most 63)")
	}
	return nil
}

// Validate says what is wrong with p, each error under path: a selector that is not
// vendor:device in hex, a selector named twice (in any case), a resource name missing or not
// one the device plugins serve. Whether a resource collides with a node's own devices (the
// hostdev driver's character devices) only the node knows. The operator, the live
// configuration and the hostdev driver all check with it.
func (p *PermittedHostDevices) Validate(path *field.Path) field.ErrorList {
	if p == nil {
		return nil
	}
	var errs field.ErrorList
	at := map[string]*field.Path{} // vendor:device → the entry that selected it
	for i, d := range p.PCIHostDevices {
		ip := path.Child("pciHostDevices").Index(i)
		vendor, device, ok := d.Selector()
		switch {
		case !ok:
			errs = append(errs, field.Invalid(ip.Child("pciVendorSelector"), d.PCIVendorSelector, `want vendor:device, four hex digits each ("10DE:1EB8")`))
		case at[vendor+":"+device] != nil:
			errs = append(errs, field.Invalid(ip.Child("pciVendorSelector"), d.PCIVendorSelector, "already selected by "+at[vendor+":"+device].String()))
		default:
			at[vendor+":"+device] = ip
		}
		if d.ResourceName == "" {
			errs = append(errs, field.Required(ip.Child("resourceName"), "the resource the functions become (devices.kubevisor.io/<name>)"))
		} else if err := CheckDeviceResource(d.ResourceName); err != nil {
			errs = append(errs, field.Invalid(ip.Child("resourceName"), d.ResourceName, err.Error()))
		}
	}
	return errs
}
