package domain_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

func validSpec() *domainv1.DomainSpec {
	return &domainv1.DomainSpec{
		Id:     "6a1f0c1e-0000-4000-8000-000000000001",
		Name:   "default/demo",
		Memory: &domainv1.Memory{GuestBytes: 128 << 20},
		Cpu:    &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
			KernelPath: "/var/lib/kubevisor/guest/vmlinuz", InitrdPath: "/var/lib/kubevisor/guest/initrd"}}},
		Disks: []*domainv1.Disk{
			{Name: "root", Path: "/run/kubevisor/vm/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, BootOrder: 1},
			{Name: "cloudinit", Path: "/run/kubevisor/vm/cidata.iso", Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
		},
		Nics:   []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01", BootOrder: 2}},
		Serial: &domainv1.Serial{SocketPath: "/run/kubevisor/vm/serial.sock"},
	}
}

func TestValidateAcceptsValidSpec(t *testing.T) {
	if err := domain.Validate(validSpec()); err != nil {
		t.Fatalf("Validate = %v", err)
	}
	pinned := validSpec()
	pinned.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{3, 1}, EmulatorHostCpus: []uint32{0}}
	pinned.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{1}, MemoryBytes: 64 << 20, HostNodes: []uint32{0}}, {Vcpus: []uint32{0}, MemoryBytes: 64 << 20, HostNodes: []uint32{1}}}
	if err := domain.Validate(pinned); err != nil {
		t.Fatalf("Validate of a pinned spec = %v", err)
	}
	if n := domain.VCPUs(validSpec()); n != 2 {
		t.Fatalf("VCPUs = %d, want 2", n)
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*domainv1.DomainSpec)
		field  string
	}{
		{"no id", func(s *domainv1.DomainSpec) { s.Id = "" }, "id"},
		{"no memory", func(s *domainv1.DomainSpec) { s.Memory = nil }, "memory.guestBytes"},
		{"a persistent TPM without a persistent state directory", func(s *domainv1.DomainSpec) {
			s.Tpm = &domainv1.TPM{Persistent: true}
		}, "persistentStateDir"},
		{"a persistent state directory with nothing persistent", func(s *domainv1.DomainSpec) {
			s.Tpm, s.PersistentStateDir = &domainv1.TPM{}, "/state"
		}, "persistentStateDir"},
		{"a relative persistent state directory", func(s *domainv1.DomainSpec) {
			s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{Persistent: true}}}
			s.PersistentStateDir = "state"
		}, "persistentStateDir"},
		{"an incoming migration without a socket", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{}
		}, "incomingMigration.socketPath"},
		{"an incoming migration on a relative socket", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "migration.sock"}
		}, "incomingMigration.socketPath"},
		{"an incoming migration on a socket outside the run directory", func(s *domainv1.DomainSpec) {
			s.RunDir, s.IncomingMigration = "/run/vm", &domainv1.IncomingMigration{SocketPath: "/run/vm2/migration.sock"}
		}, "incomingMigration.socketPath"},
		{"an incoming migration on a socket path too long to bind", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/" + strings.Repeat("d", 120)}
		}, "incomingMigration.socketPath"},
		{"an incoming migration that starts paused", func(s *domainv1.DomainSpec) {
			s.StartPaused, s.IncomingMigration = true, &domainv1.IncomingMigration{SocketPath: "/run/migration.sock"}
		}, "startPaused"},
		{"incoming disks without their socket", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", Disks: []string{"root"}}
		}, "incomingMigration.disksSocketPath"},
		{"an incoming disks socket with no disk to serve", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", DisksSocketPath: "/run/disks.sock"}
		}, "incomingMigration.disksSocketPath"},
		{"the incoming disks on the migration stream's socket", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", DisksSocketPath: "/run/migration.sock", Disks: []string{"root"}}
		}, "incomingMigration.disksSocketPath"},
		{"the incoming disks on a socket outside the run directory", func(s *domainv1.DomainSpec) {
			s.RunDir = "/run/vm"
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/vm/migration.sock", DisksSocketPath: "/run/vm2/disks.sock", Disks: []string{"root"}}
		}, "incomingMigration.disksSocketPath"},
		{"an incoming disk the spec lacks", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", DisksSocketPath: "/run/disks.sock", Disks: []string{"root", "data"}}
		}, "incomingMigration.disks[1]"},
		{"an incoming read-only CD-ROM to copy", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", DisksSocketPath: "/run/disks.sock", Disks: []string{"cloudinit"}}
		}, "incomingMigration.disks[0]"},
		{"an incoming disk named twice", func(s *domainv1.DomainSpec) {
			s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/migration.sock", DisksSocketPath: "/run/disks.sock", Disks: []string{"root", "root"}}
		}, "incomingMigration.disks[1]"},
		{"huge page size not a power of two", func(s *domainv1.DomainSpec) {
			s.Memory.Hugepages = &domainv1.Hugepages{PageSizeBytes: 3 << 20, Path: "/huge"}
		}, "memory.hugepages.pageSizeBytes"},
		{"guest memory not whole huge pages", func(s *domainv1.DomainSpec) {
			s.Memory.Hugepages = &domainv1.Hugepages{PageSizeBytes: 1 << 30, Path: "/huge"}
		}, "memory.guestBytes"},
		{"relative hugetlbfs path", func(s *domainv1.DomainSpec) {
			s.Memory.Hugepages = &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "huge"}
		}, "memory.hugepages.path"},
		{"too many vcpus", func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Sockets: 4, Cores: 64, Threads: 4} }, "cpu"},
		{"a host CPU short of the vCPUs", func(s *domainv1.DomainSpec) {
			s.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}}
		}, "cpu.pinning.vcpuHostCpus"},
		{"two vCPUs on one host CPU", func(s *domainv1.DomainSpec) {
			s.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 1}}
		}, "cpu.pinning.vcpuHostCpus[1]"},
		{"the emulator on a vCPU's host CPU", func(s *domainv1.DomainSpec) {
			s.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 2}, EmulatorHostCpus: []uint32{0, 2}}
		}, "cpu.pinning.emulatorHostCpus[1]"},
		{"an emulator CPU twice", func(s *domainv1.DomainSpec) {
			s.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 2}, EmulatorHostCpus: []uint32{0, 0}}
		}, "cpu.pinning.emulatorHostCpus[1]"},
		{"a vCPU in no NUMA node", func(s *domainv1.DomainSpec) {
			s.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: 128 << 20}}
		}, "cpu.numaCells"},
		{"a vCPU in two NUMA nodes", func(s *domainv1.DomainSpec) {
			s.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{0, 1}, MemoryBytes: 64 << 20}, {Vcpus: []uint32{1}, MemoryBytes: 64 << 20}}
		}, "cpu.numaCells[1].vcpus[0]"},
		{"NUMA nodes short of the guest memory", func(s *domainv1.DomainSpec) {
			s.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: 32 << 20}, {Vcpus: []uint32{1}, MemoryBytes: 64 << 20}}
		}, "cpu.numaCells"},
		{"a NUMA node without memory", func(s *domainv1.DomainSpec) {
			s.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{0, 1}, MemoryBytes: 128 << 20}, {Vcpus: []uint32{}}}
		}, "cpu.numaCells[1].memoryBytes"},
		{"a NUMA node's memory not whole huge pages", func(s *domainv1.DomainSpec) {
			s.Memory.Hugepages = &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/huge"}
			s.Cpu.NumaCells = []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: 63 << 20}, {Vcpus: []uint32{1}, MemoryBytes: 65 << 20}}
		}, "cpu.numaCells[0].memoryBytes"},
		{"relative kernel", func(s *domainv1.DomainSpec) { s.GetFirmware().GetKernel().KernelPath = "vmlinuz" }, "firmware.kernel.kernelPath"},
		{"missing kernel", func(s *domainv1.DomainSpec) { s.GetFirmware().GetKernel().KernelPath = "" }, "firmware.kernel.kernelPath"},
		{"relative disk", func(s *domainv1.DomainSpec) { s.Disks[0].Path = "root.qcow2" }, "disks[0].path"},
		{"a lun on virtio", func(s *domainv1.DomainSpec) {
			s.Disks[1].Device, s.Disks[1].Bus = domainv1.DiskDevice_DISK_DEVICE_LUN, domainv1.DiskBus_DISK_BUS_VIRTIO
		}, "disks[1].bus"},
		{"a qcow2 lun", func(s *domainv1.DomainSpec) {
			s.Disks[0].Device, s.Disks[0].Bus = domainv1.DiskDevice_DISK_DEVICE_LUN, domainv1.DiskBus_DISK_BUS_SCSI
		}, "disks[0].format"},
		{"unnamed disk", func(s *domainv1.DomainSpec) { s.Disks[1].Name = "" }, "disks[1].name"},
		{"duplicate disk", func(s *domainv1.DomainSpec) { s.Disks[1].Name = "root" }, "disks[1].name"},
		{"duplicate boot order", func(s *domainv1.DomainSpec) { s.Nics[0].BootOrder = 1 }, "nics[0].bootOrder"},
		{"bad mac", func(s *domainv1.DomainSpec) { s.Nics[0].Mac = "02:00:00:00:00" }, "nics[0].mac"},
		{"multicast mac", func(s *domainv1.DomainSpec) { s.Nics[0].Mac = "01:00:5e:00:00:01" }, "nics[0].mac"},
		{"no tap", func(s *domainv1.DomainSpec) { s.Nics[0].TapName = "" }, "nics[0]"},
		{"tap twice", func(s *domainv1.DomainSpec) { s.Nics[0].TapFdPath = "/proc/self/fd/3" }, "nics[0]"},
		{"relative serial", func(s *domainv1.DomainSpec) { s.Serial.SocketPath = "serial.sock" }, "serial.socketPath"},
		{"bad pci", func(s *domainv1.DomainSpec) { s.HostDevices = []*domainv1.HostDevice{{PciAddress: "01:00.0"}} }, "hostDevices[0].pciAddress"},
		{"host device of nothing", func(s *domainv1.DomainSpec) { s.HostDevices = []*domainv1.HostDevice{{Name: "x"}} }, "hostDevices[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := proto.Clone(validSpec()).(*domainv1.DomainSpec)
			tt.mutate(spec)
			err := domain.Validate(spec)
			if err == nil {
				t.Fatal("Validate accepted an invalid spec")
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("code = %v, want InvalidArgument", status.Code(err))
			}
			if !strings.Contains(err.Error(), tt.field+": ") {
				t.Errorf("error %q does not name field %q", err, tt.field)
			}
		})
	}
}

func TestValidateNil(t *testing.T) {
	if err := domain.Validate(nil); err == nil || !strings.Contains(err.Error(), "domain: required") {
		t.Fatalf("Validate(nil) = %v", err)
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	spec := validSpec()
	spec.Id = ""
	spec.Memory = nil
	err := domain.Validate(spec)
	verr, ok := err.(domain.ValidationError)
	if !ok || len(verr) != 2 {
		t.Fatalf("Validate = %#v, want two field errors", err)
	}
}

// TestHostDeviceWithoutPCI: a device driver's device with no PCI address is a valid host device
// (known by its resource), which NonPCIHostDevices names by field path for the drivers that pass
// through PCI functions only.
func TestHostDeviceWithoutPCI(t *testing.T) {
	spec := proto.Clone(validSpec()).(*domainv1.DomainSpec)
	spec.HostDevices = []*domainv1.HostDevice{
		{Name: "gpu", PciAddress: "0000:01:00.0", Resource: "gpu"},
		{Name: "sim", Resource: "example-sim", DeviceIds: []string{"sim-1"}},
	}
	if err := domain.Validate(spec); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	got := domain.NonPCIHostDevices(spec)
	if len(got) != 1 || got[0].Field != "hostDevices[1]" || !strings.Contains(got[0].Detail, `"sim" (resource "example-sim", ids sim-1) has no PCI address`) {
		t.Fatalf("NonPCIHostDevices = %v, want hostDevices[1] naming sim", got)
	}
}

// TestValidateAcceptsIncomingDisks: a target serving its writable disk on a second socket in its
// run directory is valid.
func TestValidateAcceptsIncomingDisks(t *testing.T) {
	s := validSpec()
	s.RunDir = "/run/vm"
	s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: "/run/vm/migration.sock", DisksSocketPath: "/run/vm/migration-disks.sock", Disks: []string{"root"}}
	if err := domain.Validate(s); err != nil {
		t.Fatalf("Validate = %v", err)
	}
}
