package imagebuild

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// QEMUOptions says which host QEMU goes into a layer.
type QEMUOptions struct {
	// Binaries are the QEMU executables (looked up in PATH when relative); default
	// qemu-system-x86_64, qemu-img, qemu-storage-daemon (the NBD server of the disks a libvirt
	// migration target receives) and swtpm (the TPM emulator the qmp driver starts beside QEMU,
	// at the host's path, where the driver found it).
	Binaries []string
	// DataDirs are copied whole (firmware, option ROMs, keymaps, and what their symlinks
	// point to); default Debian's QEMU firmware path (/usr/share/qemu, /usr/share/seabios,
	// /usr/lib/ipxe/qemu: `strings qemu-system-x86_64` shows it) and /usr/share/OVMF.
	DataDirs []string
	// ModuleDir holds QEMU's loadable modules; Debian builds TCG itself as one
	// (accel-tcg-x86_64.so), so without it a TCG guest cannot start.
	ModuleDir string
	// Modules are glob patterns in ModuleDir; each match comes with its libraries.
	Modules []string
}

// DefaultQEMUOptions is the hypervisor runtime of the qmp driver's launcher pods: x86-64 QEMU
// with TCG and KVM, SeaBIOS and OVMF firmware, virtio display; no audio, spice, or network
// block backends (their modules pull in many libraries and the drivers use none of them); swtpm
// for the VMs' TPMs; QEMU's storage daemon for the libvirt driver's migration targets.
//
//deps:commands qemu-system-x86_64 qemu-img qemu-storage-daemon swtpm
func DefaultQEMUOptions() QEMUOptions {
	return QEMUOptions{
		Binaries:  []string{"qemu-system-x86_64", "qemu-img", "qemu-storage-daemon", "swtpm"},
		DataDirs:  []string{"/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe/qemu", "/usr/share/OVMF"},
		ModuleDir: "/usr/lib/x86_64-linux-gnu/qemu",
		Modules:   []string{"accel-*.so", "hw-display-virtio-gpu.so", "hw-display-virtio-gpu-pci.so", "hw-display-virtio-vga.so"},
	}
}

// AddQEMU adds the host's QEMU (binaries with the libraries ldd lists, data directories,
// selected modules with their libraries) to t at the host's paths.
func AddQEMU(t *Tree, o QEMUOptions) error {
	for _, b := range o.Binaries {
		if err := t.AddExecutable("", b); err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
	}
	for _, d := range o.DataDirs {
		if _, err := os.Stat(d); err != nil {
			return fmt.Errorf("qemu data: %w", err)
		}
		if err := t.AddHostTree(d); err != nil {
			return fmt.Errorf("qemu data: %w", err)
		}
	}
	var mods []string
	for _, pat := range o.Modules {
		m, err := filepath.Glob(filepath.Join(o.ModuleDir, pat))
		if err != nil {
			return err
		}
		mods = append(mods, m...)
	}
	sort.Strings(mods)
	for _, m := range mods {
		if err := t.AddHostPath(m); err != nil {
			return fmt.Errorf("qemu module: %w", err)
		}
		if err := t.AddLibraries(m); err != nil {
			return fmt.Errorf("qemu module: %w", err)
		}
	}
	return nil
}
