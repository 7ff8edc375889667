package deviceplugins

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// VFIO device nodes: the container node every VFIO user opens, and one node per IOMMU group.
const (
	vfioDir       = "/dev/vfio"
	vfioContainer = vfioDir + "/vfio"
)

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

// DiscoverPCIDevices lists every PCI function under sysfsRoot/bus/pci/devices.
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

// vfioDevices advertises the PCI functions bound to vfio-pci that match its selectors, one
// kubelet device per PCI address, healthy while bound with its IOMMU group node present.
type vfioDevices struct {
	resource  string
	selectors []PCISelector
	sysfsRoot string
	devRoot   string
	log       func(msg string, args ...any)
	// known holds every device ever listed, so a device that goes away is reported Unhealthy
	// rather than silently dropped.
	known map[string]PCIDevice
}

func (v *vfioDevices) matches(d PCIDevice) bool {
	return slices.ContainsFunc(v.selectors, func(s PCISelector) bool { return s.Vendor == d.Vendor && s.Device == d.Device })
}

func (v *vfioDevices) scan() []*pluginapi.Device {
	if v.known == nil {
		v.known = map[string]PCIDevice{}
	}
	all, err := DiscoverPCIDevices(v.sysfsRoot)
	if err != nil {
		// Keep what is known; a transient sysfs error must not empty the node's capacity.
		v.log("discover pci devices", "error", err)
	}
	present := map[string]bool{}
	for _, d := range all {
		if !v.matches(d) || d.Driver != VFIODriver || d.IOMMUGroup == "" {
			continue
		}
		present[d.Address] = true
		v.known[d.Address] = d
	}
	list := make([]*pluginapi.Device, 0, len(v.known))
	for _, addr := range slices.Sorted(maps.Keys(v.known)) {
		d := v.known[addr]
		health := pluginapi.Unhealthy
		if present[addr] && exists(filepath.Join(v.devRoot, vfioDir, d.IOMMUGroup)) {
			health = pluginapi.Healthy
		}
		dev := &pluginapi.Device{ID: addr, Health: health}
		if d.NUMANode >= 0 {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		list = append(list, dev)
	}
	return list
}

// allocate hands the VFIO container node and each group node once, and tells the container
// which addresses it got, since a group node alone does not say which function to assign.
func (v *vfioDevices) allocate(ids []string) *pluginapi.ContainerAllocateResponse {
	specs := []*pluginapi.DeviceSpec{{HostPath: vfioContainer, ContainerPath: vfioContainer, Permissions: "rw"}}
	var groups []string
	for _, id := range ids {
		if g := v.known[id].IOMMUGroup; !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	slices.Sort(groups)
	for _, g := range groups {
		p := filepath.Join(vfioDir, g)
		specs = append(specs, &pluginapi.DeviceSpec{HostPath: p, ContainerPath: p, Permissions: "rw"})
	}
	addrs := slices.Sorted(slices.Values(ids))
	return &pluginapi.ContainerAllocateResponse{
		Devices: specs,
		Envs:    map[string]string{PCIResourceEnvVar(v.resource): strings.Join(addrs, ",")},
	}
}

// preferred keeps IOMMU groups together. A container is handed whole group nodes, and VFIO
// lets one process at a time use a group, so a group's functions split across two pods leave
// the second unable to open it. It takes, in order: mustInclude; the free functions of groups
// already touched; groups that are wholly free and still fit, largest first; then whatever is
// left, by address.
func (v *vfioDevices) preferred(available, mustInclude []string, size int) []string {
	free := slices.Sorted(slices.Values(available))
	var chosen []string
	take := func(id string) {
		if len(chosen) < size && !slices.Contains(chosen, id) {
			chosen = append(chosen, id)
		}
	}
	total := map[string]int{}
	for _, d := range v.known {
		total[d.IOMMUGroup]++
	}
	members := map[string][]string{}
	for _, id := range free {
		g := v.known[id].IOMMUGroup
		members[g] = append(members[g], id)
	}
	for _, id := range mustInclude {
		take(id)
	}
	for _, id := range slices.Clone(chosen) {
		for _, m := range members[v.known[id].IOMMUGroup] {
			take(m)
		}
	}
	groups := slices.Collect(maps.Keys(members))
	slices.SortFunc(groups, func(a, b string) int {
		if d := len(members[b]) - len(members[a]); d != 0 {
			return d
		}
		return strings.Compare(members[a][0], members[b][0])
	})
	for _, g := range groups {
		if ms := members[g]; len(ms) == total[g] && len(ms) <= size-len(chosen) {
			for _, id := range ms {
				take(id)
			}
		}
	}
	for _, id := range free {
		take(id)
	}
	return chosen
}

func (v *vfioDevices) watchDirs() []string { return []string{filepath.Join(v.devRoot, vfioDir)} }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
