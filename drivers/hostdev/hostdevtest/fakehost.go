// Package hostdevtest builds fake host trees (/dev and /sys in a temporary directory) for tests
// of the hostdev driver and of what it feeds (the kubelet device plugins).
package hostdevtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Host is a /dev and /sys tree in a temporary directory.
type Host struct {
	// DevRoot holds dev/...; SysRoot is the fake sysfs.
	DevRoot, SysRoot string
}

// PCI is one fake PCI function.
type PCI struct {
	Addr, Vendor, Device, Driver, Group, NUMA string
}

// DefaultPCI are the fake host's PCI functions: two NVIDIA functions bound to vfio-pci in
// groups 12 and 13, one with the same ID bound to another driver, one with no driver, and an
// Intel function bound to vfio-pci in group 15.
var DefaultPCI = []PCI{
	{"0000:01:00.0", "0x10de", "0x1eb8", "vfio-pci", "12", "0"},
	{"0000:02:00.0", "0x10de", "0x1eb8", "vfio-pci", "13", "-1"},
	{"0000:03:00.0", "0x10de", "0x1eb8", "nvidia", "14", "0"},
	{"0000:05:00.0", "0x10DE", "0x1EB8", "", "16", "0"},
	{"0000:04:00.0", "0x8086", "0x1572", "vfio-pci", "15", "1"},
}

// New returns a host with /dev/kvm, /dev/net/tun, /dev/vhost-net, /dev/sev, /dev/vfio/vfio,
// /dev/vfio/{12,13,14,15} (plain files) and DefaultPCI.
func New(t testing.TB) *Host {
	t.Helper()
	root := t.TempDir()
	h := &Host{DevRoot: filepath.Join(root, "host"), SysRoot: filepath.Join(root, "sys")}
	for _, p := range []string{"/dev/kvm", "/dev/net/tun", "/dev/vhost-net", "/dev/sev", "/dev/vfio/vfio", "/dev/vfio/12", "/dev/vfio/13", "/dev/vfio/14", "/dev/vfio/15"} {
		h.Touch(t, p)
	}
	for _, d := range DefaultPCI {
		h.AddPCI(t, d)
	}
	return h
}

// AddPCI adds a PCI function the way sysfs shows it: the real directory under devices/,
// linked from bus/pci/devices, with driver and iommu_group links.
func (h *Host) AddPCI(t testing.TB, d PCI) {
	t.Helper()
	real := filepath.Join(h.SysRoot, "devices", "pci0000:00", d.Addr)
	mkdir(t, real)
	write(t, filepath.Join(real, "vendor"), d.Vendor+"\n")
	write(t, filepath.Join(real, "device"), d.Device+"\n")
	write(t, filepath.Join(real, "numa_node"), d.NUMA+"\n")
	if d.Driver != "" {
		symlink(t, "../../../bus/pci/drivers/"+d.Driver, filepath.Join(real, "driver"))
	}
	symlink(t, "../../../kernel/iommu_groups/"+d.Group, filepath.Join(real, "iommu_group"))
	mkdir(t, filepath.Join(h.SysRoot, "bus", "pci", "devices"))
	symlink(t, "../../../devices/pci0000:00/"+d.Addr, filepath.Join(h.SysRoot, "bus", "pci", "devices", d.Addr))
}

// Touch creates the device node devPath ("/dev/kvm") as a plain file.
func (h *Host) Touch(t testing.TB, devPath string) {
	t.Helper()
	p := filepath.Join(h.DevRoot, devPath)
	mkdir(t, filepath.Dir(p))
	write(t, p, "")
}

// Remove removes the device node devPath.
func (h *Host) Remove(t testing.TB, devPath string) {
	t.Helper()
	if err := os.Remove(filepath.Join(h.DevRoot, devPath)); err != nil {
		t.Fatal(err)
	}
}

// Rebind points a PCI function's driver link elsewhere, as unbinding and binding do.
func (h *Host) Rebind(t testing.TB, addr, driver string) {
	t.Helper()
	link := filepath.Join(h.SysRoot, "devices", "pci0000:00", addr, "driver")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	symlink(t, "../../../bus/pci/drivers/"+driver, link)
}

// Config returns the hostdev driver's JSON configuration for this host: its roots, the poll
// interval, the default character devices with slots slots each, and a permittedHostDevices
// entry per "vendor:device=resource" in pci.
func (h *Host) Config(t testing.TB, poll string, slots int, pci ...string) []byte {
	t.Helper()
	type char struct {
		ResourceName string `json:"resourceName"`
		Path         string `json:"path"`
		Slots        int    `json:"slots"`
	}
	type sel struct {
		PCIVendorSelector string `json:"pciVendorSelector"`
		ResourceName      string `json:"resourceName"`
	}
	cfg := struct {
		DevRoot      string `json:"devRoot"`
		SysfsRoot    string `json:"sysfsRoot"`
		PollInterval string `json:"pollInterval"`
		CharDevices  []char `json:"charDevices"`
		Permitted    struct {
			PCI []sel `json:"pciHostDevices"`
		} `json:"permittedHostDevices"`
	}{DevRoot: h.DevRoot, SysfsRoot: h.SysRoot, PollInterval: poll}
	for _, c := range [][2]string{{"kvm", "/dev/kvm"}, {"tun", "/dev/net/tun"}, {"vhost-net", "/dev/vhost-net"}, {"sev", "/dev/sev"}} {
		cfg.CharDevices = append(cfg.CharDevices, char{ResourceName: c[0], Path: c[1], Slots: slots})
	}
	for _, p := range pci {
		id, res, _ := strings.Cut(p, "=")
		cfg.Permitted.PCI = append(cfg.Permitted.PCI, sel{PCIVendorSelector: id, ResourceName: res})
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mkdir(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t testing.TB, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t testing.TB, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
