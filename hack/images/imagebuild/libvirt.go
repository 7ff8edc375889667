package imagebuild

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// LibvirtOptions says which of the host's libvirt goes into a layer.
type LibvirtOptions struct {
	// Binaries are executables added with their libraries (looked up in PATH when relative).
	Binaries []string
	// ModuleDir holds libvirt's loadable modules; Modules are glob patterns in it, each match
	// added with its libraries.
	ModuleDir string
	Modules   []string
	// DataDirs are copied whole; Files one by one.
	DataDirs []string
	Files    []string
}

// DefaultLibvirtOptions is what the libvirt driver's per-VMI daemon needs in a launcher pod:
// Debian's monolithic libvirtd (libvirt 9.0 has no virtqemud) with the QEMU driver and the
// modules it loads in session mode (storage, to read disk images' backing chains; secret;
// nodedev; network; interface; nwfilter: libvirtd loads each one it finds, and the host's
// daemon ran with all), the CPU map and schemas of /usr/share/libvirt, setpriv (util-linux),
// with which the launcher drops to the daemon's unprivileged user, and swtpm's tools with their
// configuration (swtpm-tools), which libvirt runs to manufacture and drive an emulated TPM (swtpm
// itself is in the QEMU layer), and GnuTLS's certtool, with which swtpm_localca makes the TPM's
// local CA and EK certificate. No virtlogd: the driver's daemons write QEMU's output to files
// (stdio_handler "file").
//
//deps:commands libvirtd setpriv swtpm_setup swtpm_ioctl swtpm_localca swtpm_cert certtool
func DefaultLibvirtOptions() LibvirtOptions {
	return LibvirtOptions{
		Binaries:  []string{"libvirtd", "setpriv", "swtpm_setup", "swtpm_ioctl", "swtpm_localca", "swtpm_cert", "certtool"},
		ModuleDir: "/usr/lib/x86_64-linux-gnu/libvirt",
		Modules:   []string{"connection-driver/*.so", "storage-backend/libvirt_storage_backend_fs.so", "storage-file/*.so"},
		DataDirs:  []string{"/usr/share/libvirt"},
		Files:     []string{"/etc/swtpm_setup.conf", "/etc/swtpm-localca.conf", "/etc/swtpm-localca.options"},
	}
}

// AddLibvirt adds the host's libvirt daemon (binaries and modules with the libraries ldd lists,
// data directories) to t at the host's paths.
func AddLibvirt(t *Tree, o LibvirtOptions) error {
	for _, b := range o.Binaries {
		if err := t.AddExecutable("", b); err != nil {
			return fmt.Errorf("libvirt: %w", err)
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
	if len(mods) == 0 {
		return fmt.Errorf("libvirt: no modules in %s (libvirt-daemon-driver-qemu installed?)", o.ModuleDir)
	}
	sort.Strings(mods)
	for _, m := range mods {
		if err := t.AddHostPath(m); err != nil {
			return fmt.Errorf("libvirt module: %w", err)
		}
		if err := t.AddLibraries(m); err != nil {
			return fmt.Errorf("libvirt module: %w", err)
		}
	}
	for _, d := range o.DataDirs {
		if _, err := os.Stat(d); err != nil {
			return fmt.Errorf("libvirt data: %w", err)
		}
		if err := t.AddHostTree(d); err != nil {
			return fmt.Errorf("libvirt data: %w", err)
		}
	}
	for _, f := range o.Files {
		if err := t.AddHostPath(f); err != nil {
			return fmt.Errorf("libvirt data: %w", err)
		}
	}
	return nil
}
