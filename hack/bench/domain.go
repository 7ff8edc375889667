package bench

import (
	"fmt"
	"path/filepath"
	"slices"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// Names of the files of a VM slot in its run directory.
const (
	serialSocket = "serial.sock"
	overlayFile  = "disk.qcow2"
	diskName     = "rootdisk"
)

// slot is one VM of the bench: the same id, run directory and overlay path in a raw run and in
// a plugin run, so that both have the same command line.
type slot struct {
	id      string
	runDir  string
	overlay string
}

func newSlot(workDir string, i int) slot {
	runDir := filepath.Join(workDir, fmt.Sprintf("vm%d", i))
	return slot{id: fmt.Sprintf("bench-%d", i), runDir: runDir, overlay: filepath.Join(runDir, overlayFile)}
}

// GuestDomain is the domain spec of a bench VM: the guest's kernel, initramfs and command line
// (direct kernel boot), memory bytes of memory, one virtio disk (the qcow2 overlay at overlay, over
// the guest's disk image), the serial console on a socket in runDir, and the machine type, CPU
// and accelerator the driver picks by default.
func GuestDomain(g conformance.Guest, id, runDir, overlay string, memory uint64) *domainv1.DomainSpec {
	return &domainv1.DomainSpec{
		Id:     id,
		Name:   "kubevisor-bench/" + id,
		Memory: &domainv1.Memory{GuestBytes: memory},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
			KernelPath: g.Kernel, InitrdPath: g.Initrd, Cmdline: g.Cmdline,
		}}},
		Disks: []*domainv1.Disk{{
			Name:   diskName,
			Path:   overlay,
			Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2,
			Bus:    domainv1.DiskBus_DISK_BUS_VIRTIO,
		}},
		Serial: &domainv1.Serial{SocketPath: filepath.Join(runDir, serialSocket)},
		RunDir: runDir,
	}
}

// RawArgs returns the driver's QEMU arguments for a run without the driver: the same, less the
// one thing only the driver's protocol needs, -S (start with the vCPUs stopped until QMP
// `cont`), so that the guest runs at once.
func RawArgs(args []string) ([]string, error) {
	if n := count(args, "-S"); n != 1 {
		return nil, fmt.Errorf("the driver's command line has %d -S options, want 1: %q", n, args)
	}
	return slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "-S" }), nil
}

func count(args []string, s string) int {
	n := 0
	for _, a := range args {
		if a == s {
			n++
		}
	}
	return n
}
