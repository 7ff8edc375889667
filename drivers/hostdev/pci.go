package hostdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// VFIO device nodes: the container node every VFIO user opens, and one node per IOMMU group.
const (
	vfioDir       = "/dev/vfio"
	vfioContainer = vfioDir + "/vfio"
)

// VFIODriver is the kernel driver a PCI function must be bound to before it can be passed
// through.
const VFIODriver = "vfio-pci"

// PCIDevice is a PCI function as sysfs describes it.
type PCIDevice struct {
	// Address is the PCI address, e.g. 0000:01:00.0.
	Address string
	// Vendor and Device are the lowercase hex IDs without "0x", e.g. "10de" and "1eb8".
	Vendor, Device string
	// Driver is the bound kernel driver, empty if none.
	Driver string
	// IOMMUGroup is the IOMMU group number, empty without an IOMMU.
	IOMMUGroup string
	// NUMANode is the device's NUMA node, -1 when unknown.
	NUMANode int
}

// ID is the function's vendor:device ID ("10de:1eb8").
func (d PCIDevice) ID() string { return d.Vendor + ":" + d.Device }

// DiscoverPCIDevices lists every PCI function under sysfsRoot/bus/pci/devices. A sysfs without
// PCI devices is no error: the list is empty.
func DiscoverPCIDevices(sysfsRoot string) ([]PCIDevice, error) {
	dir := filepath.Join(sysfsRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read pci devices: %w", err)
	}
	var devs []PCIDevice
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		vendor, err1 := os.ReadFile(filepath.Join(p, "vendor"))
		device, err2 := os.ReadFile(filepath.Join(p, "device"))
		if err := errors.Join(err1, err2); err != nil {
			// A device hot-unplugged while we read is simply not there.
			continue
		}
		d := PCIDevice{
			Address:    e.Name(),
			Vendor:     normalizeID(string(vendor)),
			Device:     normalizeID(string(device)),
			Driver:     linkBase(filepath.Join(p, "driver")),
			IOMMUGroup: linkBase(filepath.Join(p, "iommu_group")),
			NUMANode:   -1,
		}
		if b, err := os.ReadFile(filepath.Join(p, "numa_node")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				d.NUMANode = n
			}
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// linkBase is the last element of a sysfs symlink's target ("vfio-pci" for a driver link,
// "12" for an iommu_group link), empty when there is no link.
func linkBase(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// normalizeID turns "0x10DE" and "10de" alike into sysfs's lowercase form without the prefix.
func normalizeID(id string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(id)), "0x")
}

// groupBlocker returns, for an IOMMU group, a member that keeps the group from being used
// through VFIO: one bound to a host driver other than vfio-pci, pci-stub or pcieport (a bridge
// the kernel allows in a group). The kernel refuses to open the group's node while such a
// member exists, so every function of the group is then unusable. Empty when the group is
// viable.
func groupBlocker(group string, all []PCIDevice) *PCIDevice {
	for i, d := range all {
		if d.IOMMUGroup != group {
			continue
		}
		switch d.Driver {
		case "", VFIODriver, "pci-stub", "pcieport":
		default:
			return &all[i]
		}
	}
	return nil
}

// PCIResourceEnvPrefix starts the environment variable that lists the PCI addresses a
// container got, as in KubeVirt (see PCIResourceEnvVar).
const PCIResourceEnvPrefix = "PCI_RESOURCE"

// PCIResourceEnvVar names the environment variable that lists, comma-separated, the PCI
// addresses a container was allocated for resourceName (the extended resource,
// "devices.kubevisor.io/gpu"): KubeVirt's naming (PCI_RESOURCE_<resource upper-cased, "/" and
// "." as "_">), with "-" also turned into "_" so that a shell can read it.
func PCIResourceEnvVar(resourceName string) string {
	r := strings.NewReplacer("/", "_", ".", "_", "-", "_")
	return PCIResourceEnvPrefix + "_" + r.Replace(strings.ToUpper(resourceName))
}
