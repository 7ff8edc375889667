package qmp

import (
	"errors"
	"reflect"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/internal/domainseed"
)

// preconditionRE starts a FailedPrecondition of BuildArgs: the field that needs what the node
// lacks.
var preconditionRE = regexp.MustCompile(`^[a-z][A-Za-z0-9_.\[\]]*: `)

// fuzzEnv is a node for BuildArgs, chosen by the bits of b: KVM or TCG, OVMF installed, swtpm
// usable, /dev/vhost-net, AMD SEV(-ES), this QEMU's CPU models and machine types known, and every
// lun path a device that takes SG_IO.
func fuzzEnv(b byte, spec *domainv1.DomainSpec) HostEnv {
	env := HostEnv{Accel: AccelTCG, RunDir: "/run/kubevisor/vmis/vm", SWTPMReason: "swtpm not found", SEVReason: "kvm_amd sev is N",
		Now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }}
	if b&1 != 0 {
		env.Accel = AccelKVM
	}
	if b&2 != 0 {
		env.OVMF = DefaultOVMF
	}
	if b&4 != 0 {
		env.SWTPM, env.SWTPMReason = "/usr/bin/swtpm", ""
	}
	env.VhostNet = b&8 != 0
	if b&16 != 0 {
		env.SEV, env.SEVReason = &SEVHost{CBitPos: 47, ReducedPhysBits: 1, ES: b&32 != 0}, ""
	}
	if b&64 != 0 {
		env.CPUModels = []string{"max", "host", "qemu64", "Skylake-Client", "EPYC"}
		env.MachineTypes = []string{"q35", "pc", "pc-q35-8.2", "pc-i440fx-8.2"}
		env.CPUFlags = []string{"vmx", "svm", "avx2", "pcid", "x2apic"}
	}
	if b&128 != 0 {
		env.SGIO, env.BlockDevices = map[string]string{}, map[string]bool{}
		for _, d := range spec.GetDisks() {
			if d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN {
				env.SGIO[d.GetPath()], env.BlockDevices[d.GetPath()] = "", true
			}
		}
	}
	return env
}

// checkBuildArgs runs what the qmp driver receives through what comes before BuildArgs (the
// host's CheckDomain against the driver's capabilities, domain.Validate and the id check of
// Create) and then BuildArgs on env: it refuses with a ValidationError naming a field each, or
// with a FailedPrecondition starting with the field, or gives a command line, the same one
// when asked again.
func checkBuildArgs(t *testing.T, spec *domainv1.DomainSpec, env HostEnv) {
	caps := (&Driver{}).capabilities()
	if env.SWTPM != "" {
		caps.Devices = append(caps.Devices, driver.DeviceTPM)
	}
	if driver.CheckDomain(caps, spec) != nil || domain.Validate(spec) != nil || !idRE.MatchString(spec.GetId()) {
		return
	}
	cmd, err := BuildArgs(spec, env)
	if err != nil {
		var ve domain.ValidationError
		switch {
		case errors.As(err, &ve):
			for _, fe := range ve {
				if fe.Field == "" || fe.Detail == "" {
					t.Fatalf("BuildArgs refusal %q names no field", fe)
				}
			}
		case status.Code(err) == codes.FailedPrecondition:
			if msg := status.Convert(err).Message(); !preconditionRE.MatchString(msg) {
				t.Fatalf("BuildArgs precondition %q names no field", msg)
			}
		default:
			t.Fatalf("BuildArgs: %v (%T), neither a ValidationError nor a FailedPrecondition", err, err)
		}
		return
	}
	if len(cmd.Args) == 0 {
		t.Fatal("BuildArgs gave an empty command line")
	}
	again, err := BuildArgs(spec, env)
	if err != nil || !reflect.DeepEqual(again, cmd) {
		t.Fatalf("BuildArgs gave %q, then %q, %v", cmd.Args, again.Args, err)
	}
}

// fuzzSpecs are seeds beyond the assembled ones: what the driver's options look like together.
func fuzzSpecs() []*domainv1.DomainSpec {
	const mac = "52:54:00:12:34:56"
	run := "/run/kubevisor/vmis/vm"
	return []*domainv1.DomainSpec{
		baseSpec(),
		{
			Id: "vm1", Name: "ns/vm1", Uuid: "5d307ca9-b3ef-428c-8861-06e72d69f223", Machine: &domainv1.Machine{Type: "q35"},
			Cpu:      &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1, Model: "host", Features: []*domainv1.CPUFeature{{Name: "avx2", Policy: "require"}, {Name: "pcid", Policy: "disable"}}},
			Memory:   &domainv1.Memory{GuestBytes: 1 << 30},
			Firmware: &domainv1.Firmware{Serial: "s,1", Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true, Persistent: true}}},
			Disks: []*domainv1.Disk{
				{Name: "root", Path: "/var/lib/vm/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, BootOrder: 1, Cache: "none", Io: "native", DedicatedIothread: true, Queues: 2},
				{Name: "data", Path: "/dev/sdb", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_LUN, Shareable: true},
				{Name: "cd", Path: "/var/lib/vm/ci.iso", Bus: domainv1.DiskBus_DISK_BUS_SATA, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
			},
			Nics: []*domainv1.NIC{
				{Name: "default", TapName: "tap0", Mac: mac, Model: "virtio", Mtu: 1450, BootOrder: 2, Queues: 2, PciAddress: "0000:00:03.0"},
				{Name: "second", TapFdPath: "/proc/self/fd/3", Mac: "52:54:00:12:34:57", Model: "e1000e", LinkDown: true},
			},
			Serial: &domainv1.Serial{SocketPath: run + "/serial.sock"}, Vnc: &domainv1.VNC{SocketPath: run + "/vnc.sock"},
			RunDir: run, PersistentStateDir: "/var/lib/kubevisor/persistent/vm1",
			Rng: &domainv1.RNG{}, Chassis: &domainv1.Chassis{Manufacturer: "a,b", Serial: "c"}, Balloon: &domainv1.Balloon{},
			Features: &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_ON, Smm: domainv1.Toggle_TOGGLE_ON, Hyperv: []string{"relaxed", "vapic"}},
			Clock:    &domainv1.Clock{Timezone: "Europe/Paris", Hpet: domainv1.Toggle_TOGGLE_OFF, RtcTickPolicy: "catchup"},
			Inputs:   []*domainv1.Input{{Name: "tablet", Type: "tablet", Bus: "usb"}, {Name: "kbd", Type: "keyboard", Bus: "virtio"}},
			Watchdog: &domainv1.Watchdog{Name: "w", Model: "i6300esb", Action: "reset"},
			Sound:    &domainv1.Sound{Name: "s", Model: "ich9"}, Tpm: &domainv1.TPM{Persistent: true}, VirtioTransitional: true,
		},
		{
			Id: "vm2", Memory: &domainv1.Memory{GuestBytes: 2 << 30, Hugepages: &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/dev/hugepages"}},
			Cpu: &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1, Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{2, 3}, EmulatorHostCpus: []uint32{4}},
				NumaCells: []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: 1 << 30, HostNodes: []uint32{0}}, {Vcpus: []uint32{1}, MemoryBytes: 1 << 30, HostNodes: []uint32{1}}}},
			Firmware:       &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}},
			LaunchSecurity: &domainv1.LaunchSecurity{Sev: &domainv1.SEV{Policy: 0x5}},
			HostDevices:    []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}},
			StartPaused:    true,
		},
		{
			Id: "vm3", Machine: &domainv1.Machine{Type: "pc"}, Memory: &domainv1.Memory{GuestBytes: 64 << 20},
			Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: true}}},
			Disks:    []*domainv1.Disk{{Name: "usb", Path: "/var/lib/vm/u.img", Bus: domainv1.DiskBus_DISK_BUS_USB}},
			IncomingMigration: &domainv1.IncomingMigration{SocketPath: run + "/migration.sock", AllowPostCopy: true,
				DisksSocketPath: run + "/disks.sock", Disks: []string{"usb"}},
			RunDir: run,
		},
		{
			Id: "vm4", Memory: &domainv1.Memory{GuestBytes: 128 << 20}, Acceleration: domainv1.Acceleration_ACCELERATION_EMULATED,
			Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd", Cmdline: "console=ttyS0,115200"}}},
			Nics:     []*domainv1.NIC{{Name: "n", TapName: "tap0", Mac: mac, Model: "rtl8139", AcpiIndex: 3}},
			Machine:  &domainv1.Machine{Type: "pc"},
		},
	}
}

// FuzzBuildArgs feeds the qmp driver's command line builder proto-marshalled domain specs that
// pass what comes before it (checkBuildArgs), on a node chosen by a byte (fuzzEnv). The seeds
// are the specs the handler assembles from the KubeVirt examples (domainseed), this package's
// base spec and four that use most of what the driver offers.
func FuzzBuildArgs(f *testing.F) {
	specs := append(domainseed.Specs(f), fuzzSpecs()...)
	for i, s := range specs {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, byte(i*37)) // a spread of nodes
		f.Add(b, byte(0xff))
	}
	f.Fuzz(func(t *testing.T, specBytes []byte, node byte) {
		var spec domainv1.DomainSpec
		if proto.Unmarshal(specBytes, &spec) != nil {
			return
		}
		checkBuildArgs(t, &spec, fuzzEnv(node, &spec))
	})
}
