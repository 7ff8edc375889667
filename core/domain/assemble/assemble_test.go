package assemble_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

const (
	uid    = "6a1f0c1e-0000-4000-8000-000000000001"
	runDir = "/run/kubevisor/vmis/" + uid
)

func ptr[T any](v T) *T { return &v }

// testVMI is a VMI with a containerDisk, a cloud-init cdrom and a masquerade interface on the
// pod network.
func testVMI() *v1alpha1.VirtualMachineInstance {
	mem := resource.MustParse("256Mi")
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default", UID: uid, Labels: map[string]string{"app": "demo"}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Devices: v1alpha1.Devices{
					Disks: []v1alpha1.Disk{
						{Name: "root", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{}}, BootOrder: ptr(uint(1))},
						{Name: "cloudinit", DiskDevice: v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{}}},
					},
					Interfaces: []v1alpha1.Interface{
						{Name: "default", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}}},
					},
				},
			},
			Volumes: []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest"}}},
				{Name: "cloudinit", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
			},
			Networks: []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}},
		},
	}
}

func testInputs() assemble.Inputs {
	return assemble.Inputs{
		Disks: map[string]*storagev1.PreparedDisk{
			"root":      {VolumeName: "root", Path: "/var/lib/kubevisor/volumes/" + uid + "/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2},
			"cloudinit": {VolumeName: "cloudinit", Path: "/var/lib/kubevisor/volumes/" + uid + "/cloudinit.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true, Cdrom: true},
		},
		Interfaces: map[string]*networkv1.InterfaceResult{
			"default": {Name: "default", TapName: "tapeth0", Mac: "02:00:00:00:00:01", IpAddresses: []string{"10.0.2.2/24"}, Mtu: 1450, PodInterface: "eth0"},
		},
		RunDir:  runDir,
		Sandbox: &domainv1.Sandbox{NetnsPath: "/run/netns/kv-6a1f0c1e"},
	}
}

// wantSpec is Domain's answer for testVMI and testInputs.
func wantSpec() *domainv1.DomainSpec {
	return &domainv1.DomainSpec{
		Id:       uid,
		Name:     "default/demo",
		Uuid:     uid,
		Cpu:      &domainv1.CPU{Sockets: 1, Cores: 1, Threads: 1},
		Memory:   &domainv1.Memory{GuestBytes: 256 << 20},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}},
		Disks: []*domainv1.Disk{
			{Name: "root", Path: "/var/lib/kubevisor/volumes/" + uid + "/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, BootOrder: 1},
			{Name: "cloudinit", Path: "/var/lib/kubevisor/volumes/" + uid + "/cloudinit.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_SATA, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
		},
		Nics:    []*domainv1.NIC{{Name: "default", TapName: "tapeth0", Mac: "02:00:00:00:00:01", Model: "virtio", Mtu: 1450}},
		Serial:  &domainv1.Serial{SocketPath: runDir + "/serial.sock"},
		Vnc:     &domainv1.VNC{SocketPath: runDir + "/vnc.sock"},
		Sandbox: &domainv1.Sandbox{NetnsPath: "/run/netns/kv-6a1f0c1e"},
		RunDir:  runDir,
		Labels:  map[string]string{"app": "demo"},
		Balloon: &domainv1.Balloon{},
	}
}

func TestDomain(t *testing.T) {
	tests := []struct {
		name   string
		vmi    func(*v1alpha1.VirtualMachineInstance)
		inputs func(*assemble.Inputs)
		want   func(*domainv1.DomainSpec)
	}{
		{name: "defaults"},
		{
			name: "cpu topology and model",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2, Threads: 2, Model: "host-model"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 2, Model: "host-model"}
			},
		},
		{
			name: "vcpus from the cpu limit, rounded up",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
			},
			want: func(s *domainv1.DomainSpec) { s.Cpu.Sockets = 2 },
		},
		{
			name: "vcpus from the cpu request",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}
			},
			want: func(s *domainv1.DomainSpec) { s.Cpu.Sockets = 3 },
		},
		{
			name: "memory from the request",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory = nil
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
			},
			want: func(s *domainv1.DomainSpec) { s.Memory.GuestBytes = 1 << 30 },
		},
		{
			name: "memory.guest wins over the request",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
			},
		},
		{
			name: "machine, uuid, serial",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Machine = &v1alpha1.Machine{Type: "q35"}
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{UUID: "5d307ca9-b3ef-428c-8861-06e72d69f223", Serial: "KV0001"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "q35"}
				s.Uuid = "5d307ca9-b3ef-428c-8861-06e72d69f223"
				s.Firmware.Serial = "KV0001"
			},
		},
		{
			name: "efi, secure boot by default",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true}}
			},
		},
		{
			name: "efi without secure boot",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(false)}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}
			},
		},
		{
			name: "AMD SEV: NoDebug always, ES when asked",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(false)}}}
				v.Spec.Domain.LaunchSecurity = &v1alpha1.LaunchSecurity{SEV: &v1alpha1.SEV{Policy: &v1alpha1.SEVPolicy{EncryptedState: ptr(true)}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}
				s.LaunchSecurity = &domainv1.LaunchSecurity{Sev: &domainv1.SEV{Policy: 0x5}}
			},
		},
		{
			name: "AMD SEV without a policy",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(false)}}}
				v.Spec.Domain.LaunchSecurity = &v1alpha1.LaunchSecurity{SEV: &v1alpha1.SEV{}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}
				s.LaunchSecurity = &domainv1.LaunchSecurity{Sev: &domainv1.SEV{Policy: 0x1}}
			},
		},
		{
			name: "kernel boot",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{
					KernelArgs: "console=ttyS0 panic=-1",
					Container:  &v1alpha1.KernelBootContainer{Image: "kubevisor/test-guest-kernel", KernelPath: "/boot/vmlinuz"},
				}}
			},
			inputs: func(in *assemble.Inputs) {
				in.Kernel = &assemble.KernelArtifacts{KernelPath: "/var/lib/kubevisor/kernel/vmlinuz", InitrdPath: "/var/lib/kubevisor/kernel/initrd"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware.Boot = &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
					KernelPath: "/var/lib/kubevisor/kernel/vmlinuz", InitrdPath: "/var/lib/kubevisor/kernel/initrd", Cmdline: "console=ttyS0 panic=-1",
				}}
			},
		},
		{
			name: "disk and cdrom buses, cache, serial, readonly",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				d := v.Spec.Domain.Devices.Disks
				d[0].Disk = &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI, ReadOnly: true}
				d[0].Cache, d[0].Serial = v1alpha1.CacheNone, "D1"
				d[1].CDRom = &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Disks[0].Bus, s.Disks[0].ReadOnly, s.Disks[0].Cache, s.Disks[0].Serial = domainv1.DiskBus_DISK_BUS_SCSI, true, "none", "D1"
				s.Disks[1].Bus = domainv1.DiskBus_DISK_BUS_SCSI
			},
		},
		{
			name: "the caller's default buses",
			inputs: func(in *assemble.Inputs) {
				in.DiskBus, in.CDROMBus = domainv1.DiskBus_DISK_BUS_SATA, domainv1.DiskBus_DISK_BUS_SCSI
			},
			want: func(s *domainv1.DomainSpec) {
				s.Disks[0].Bus = domainv1.DiskBus_DISK_BUS_SATA
				s.Disks[1].Bus = domainv1.DiskBus_DISK_BUS_SCSI
			},
		},
		{
			name: "a cdrom the VMI makes writable stays read-only when the storage driver says so",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[1].CDRom.ReadOnly = ptr(false)
			},
		},
		{
			name: "a disk the storage driver prepared as a cdrom is what the VMI says",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[1].CDRom = nil
				v.Spec.Domain.Devices.Disks[1].Disk = &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Disks[1].Device, s.Disks[1].Bus = domainv1.DiskDevice_DISK_DEVICE_DISK, domainv1.DiskBus_DISK_BUS_VIRTIO
			},
		},
		{
			name: "a volume without a disk gets one",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks = v.Spec.Domain.Devices.Disks[1:]
			},
			want: func(s *domainv1.DomainSpec) {
				root := s.Disks[0]
				root.BootOrder = 0
				s.Disks = []*domainv1.Disk{s.Disks[1], root}
			},
		},
		{
			name: "interface model, boot order, bridge",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				i := &v.Spec.Domain.Devices.Interfaces[0]
				i.Model, i.BootOrder = "e1000", ptr(uint(2))
				i.InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
			},
			want: func(s *domainv1.DomainSpec) { s.Nics[0].Model, s.Nics[0].BootOrder = "e1000", 2 },
		},
		{
			name: "no serial console, no graphics",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.AutoattachSerialConsole = ptr(false)
				v.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr(false)
			},
			want: func(s *domainv1.DomainSpec) { s.Serial, s.Vnc = nil, nil },
		},
		{
			name: "rng",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.Rng = &v1alpha1.Rng{} },
			want: func(s *domainv1.DomainSpec) { s.Rng = &domainv1.RNG{} },
		},
		{
			name: "chassis",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Chassis = &v1alpha1.Chassis{Manufacturer: "m", Version: "v", Serial: "s", Asset: "a", Sku: "k"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Chassis = &domainv1.Chassis{Manufacturer: "m", Version: "v", Serial: "s", Asset: "a", Sku: "k"}
			},
		},
		{
			name: "features",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Machine = &v1alpha1.Machine{Type: "pc"}
				v.Spec.Domain.Features = &v1alpha1.Features{
					ACPI:       v1alpha1.FeatureState{Enabled: ptr(false)},
					APIC:       &v1alpha1.FeatureAPIC{EndOfInterrupt: true},
					SMM:        &v1alpha1.FeatureState{},
					KVM:        &v1alpha1.FeatureKVM{Hidden: true},
					Pvspinlock: &v1alpha1.FeatureState{Enabled: ptr(false)},
					Hyperv: &v1alpha1.FeatureHyperv{
						Relaxed:    &v1alpha1.FeatureState{},
						VAPIC:      &v1alpha1.FeatureState{Enabled: ptr(true)},
						VPIndex:    &v1alpha1.FeatureState{},
						SyNIC:      &v1alpha1.FeatureState{},
						Reset:      &v1alpha1.FeatureState{Enabled: ptr(false)},
						Spinlocks:  &v1alpha1.FeatureSpinlocks{Retries: ptr(uint32(8191))},
						VendorID:   &v1alpha1.FeatureVendorID{VendorID: "KubevisorHv"},
						SyNICTimer: &v1alpha1.SyNICTimer{Direct: &v1alpha1.FeatureState{}},
					},
				}
				v.Spec.Domain.Clock = &v1alpha1.Clock{Timer: &v1alpha1.Timer{Hyperv: &v1alpha1.HypervTimer{}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Features = &domainv1.Features{
					Acpi: domainv1.Toggle_TOGGLE_OFF, Smm: domainv1.Toggle_TOGGLE_ON, ApicEoi: true, KvmHidden: true,
					Pvspinlock:            domainv1.Toggle_TOGGLE_OFF,
					Hyperv:                []string{"relaxed", "vapic", "spinlocks", "vpindex", "synic", "stimer", "stimer-direct", "vendor-id"},
					HypervSpinlockRetries: 8191, HypervVendorId: "KubevisorHv",
				}
				s.Clock = &domainv1.Clock{Hyperv: domainv1.Toggle_TOGGLE_ON}
				s.Machine = &domainv1.Machine{Type: "pc"}
			},
		},
		{
			name: "features: acpi {} is the default",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{}
			},
			want: func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{} },
		},
		{
			name: "clock: timezone and timers",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				tz := v1alpha1.ClockOffsetTimezone("Asia/Kolkata")
				v.Spec.Domain.Clock = &v1alpha1.Clock{
					ClockOffset: v1alpha1.ClockOffset{Timezone: &tz},
					Timer: &v1alpha1.Timer{
						HPET: &v1alpha1.HPETTimer{Enabled: ptr(false)},
						PIT:  &v1alpha1.PITTimer{TickPolicy: "delay"},
						RTC:  &v1alpha1.RTCTimer{TickPolicy: "catchup", Track: "guest"},
						KVM:  &v1alpha1.KVMTimer{Enabled: ptr(false)},
					},
				}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Clock = &domainv1.Clock{
					Timezone: "Asia/Kolkata", Hpet: domainv1.Toggle_TOGGLE_OFF, Pit: domainv1.Toggle_TOGGLE_ON, PitTickPolicy: "delay",
					RtcTickPolicy: "catchup", RtcTrack: "guest", Kvm: domainv1.Toggle_TOGGLE_OFF,
				}
			},
		},
		{
			name: "clock: utc offset",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{OffsetSeconds: ptr(-3600)}}}
			},
			want: func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{UtcOffsetSeconds: -3600} },
		},
		{
			name: "inputs, bus usb by default",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Inputs = []v1alpha1.Input{
					{Name: "tablet", Type: v1alpha1.InputTypeTablet},
					{Name: "kbd", Type: v1alpha1.InputTypeKeyboard, Bus: v1alpha1.InputBusVirtio},
				}
				v.Spec.Domain.Devices.AutoattachInputDevice = ptr(true)
			},
			want: func(s *domainv1.DomainSpec) {
				s.Inputs = []*domainv1.Input{{Name: "tablet", Type: "tablet", Bus: "usb"}, {Name: "kbd", Type: "keyboard", Bus: "virtio"}}
			},
		},
		{
			name: "autoattachInputDevice adds a usb tablet",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.AutoattachInputDevice = ptr(true) },
			want: func(s *domainv1.DomainSpec) {
				s.Inputs = []*domainv1.Input{{Name: "default-0", Type: "tablet", Bus: "usb"}}
			},
		},
		{
			name: "watchdog, reset by default",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Watchdog = &domainv1.Watchdog{Name: "wd", Model: "i6300esb", Action: "reset"}
			},
		},
		{
			name: "watchdog action",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: v1alpha1.WatchdogActionPoweroff}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Watchdog = &domainv1.Watchdog{Name: "wd", Model: "i6300esb", Action: "poweroff"}
			},
		},
		{
			name: "disk options",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				d := &v.Spec.Domain.Devices.Disks[0]
				d.Cache, d.IO, d.DedicatedIOThread, d.Shareable = v1alpha1.CacheNone, v1alpha1.IONative, ptr(true), ptr(true)
				d.BlockSize = &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 512, Physical: 4096}}
				d.ErrorPolicy = ptr(v1alpha1.DiskErrorPolicyReport)
				v.Spec.Domain.Devices.Disks[1].IO = v1alpha1.IODefault
			},
			want: func(s *domainv1.DomainSpec) {
				d := s.Disks[0]
				d.Cache, d.Io, d.DedicatedIothread, d.Shareable = "none", "native", true, true
				d.LogicalBlockSize, d.PhysicalBlockSize, d.ErrorPolicy = 512, 4096, "report"
			},
		},
		{
			name: "lun: bus scsi, readonly, the prepared device as is",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks,
					v1alpha1.Disk{Name: "san", DiskDevice: v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{ReadOnly: true}}, BootOrder: ptr(uint(2))})
				v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "san", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/dev/sdb", Type: v1alpha1.HostDiskExists}}})
			},
			inputs: func(in *assemble.Inputs) {
				in.Disks["san"] = &storagev1.PreparedDisk{VolumeName: "san", Path: "/dev/sdb", Format: domainv1.DiskFormat_DISK_FORMAT_RAW}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Disks = append(s.Disks, &domainv1.Disk{Name: "san", Path: "/dev/sdb", Format: domainv1.DiskFormat_DISK_FORMAT_RAW,
					Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_LUN, ReadOnly: true, BootOrder: 2})
			},
		},
		{
			name: "cpu features, require by default",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Features: []v1alpha1.CPUFeature{{Name: "aes", Policy: "forbid"}, {Name: "popcnt"}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Cpu.Features = []*domainv1.CPUFeature{{Name: "aes", Policy: "forbid"}, {Name: "popcnt", Policy: "require"}}
			},
		},
		{
			name: "interface options",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				i := &v.Spec.Domain.Devices.Interfaces[0]
				i.PciAddress, i.ACPIIndex, i.State = "0000:00:1F.0", 4, v1alpha1.InterfaceStateDown
			},
			want: func(s *domainv1.DomainSpec) {
				s.Nics[0].PciAddress, s.Nics[0].AcpiIndex, s.Nics[0].LinkDown = "0000:00:1f.0", 4, true
			},
		},
		{
			name: "startStrategy Paused",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.StartStrategy = ptr(v1alpha1.StartStrategyPaused) },
			want: func(s *domainv1.DomainSpec) { s.StartPaused = true },
		},
		{
			name: "sound, ich9 by default; blockMultiQueue on the virtio disks",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Sound = &v1alpha1.SoundDevice{Name: "audio"}
				v.Spec.Domain.Devices.BlockMultiQueue = ptr(true)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2, Threads: 2}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Sound = &domainv1.Sound{Name: "audio", Model: "ich9"}
				s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 2}
				s.Disks[0].Queues = 4
			},
		},
		{
			name: "tpm: enabled unless it says false",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
			},
			want: func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
		},
		{
			name: "tpm: enabled true",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr(true)}
			},
			want: func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
		},
		{
			name: "tpm: enabled false is no TPM",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr(false)}
			},
		},
		{
			name: "tpm persistent: the flag and the persistent state directory",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(true)}
			},
			inputs: func(in *assemble.Inputs) { in.PersistentStateDir = "/var/lib/kubevisor/persistent/default/demo" },
			want: func(s *domainv1.DomainSpec) {
				s.Tpm = &domainv1.TPM{Persistent: true}
				s.PersistentStateDir = "/var/lib/kubevisor/persistent/default/demo"
			},
		},
		{
			name: "tpm persistent false: no directory, even when given",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(false)}
			},
			inputs: func(in *assemble.Inputs) { in.PersistentStateDir = "/var/lib/kubevisor/persistent/default/demo" },
			want:   func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
		},
		{
			name: "efi persistent: the flag and the persistent state directory",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(false), Persistent: ptr(true)}}}
			},
			inputs: func(in *assemble.Inputs) { in.PersistentStateDir = "/state" },
			want: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{Persistent: true}}}
				s.PersistentStateDir = "/state"
			},
		},
		{
			name: "BIOS output on the serial console",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{BIOS: &v1alpha1.BIOS{UseSerial: ptr(true)}}}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: true}}}
			},
		},
		{
			name: "ioThreadsPolicy auto: at most two threads per vCPU, round robin; dedicated apart",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				auto := v1alpha1.IOThreadsPolicyAuto
				v.Spec.Domain.IOThreadsPolicy = &auto
				for _, n := range []string{"d1", "d2", "d3"} {
					v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: n})
					v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: n, VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{}}})
				}
				v.Spec.Domain.Devices.Disks[3].DedicatedIOThread = ptr(true)
			},
			inputs: func(in *assemble.Inputs) {
				for _, n := range []string{"d1", "d2", "d3"} {
					in.Disks[n] = &storagev1.PreparedDisk{VolumeName: n, Path: "/v/" + n, Format: domainv1.DiskFormat_DISK_FORMAT_RAW}
				}
			},
			want: func(s *domainv1.DomainSpec) {
				for _, n := range []string{"d1", "d2", "d3"} {
					s.Disks = append(s.Disks, &domainv1.Disk{Name: n, Path: "/v/" + n, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO})
				}
				// 1 vCPU: a pool of 2 for root, d1 and d3 (d2 has its own; the cdrom none).
				s.Disks[0].Iothread, s.Disks[2].Iothread, s.Disks[4].Iothread = "iothread0", "iothread1", "iothread0"
				s.Disks[3].DedicatedIothread = true
			},
		},
		{
			name: "ioThreadsPolicy shared",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				shared := v1alpha1.IOThreadsPolicyShared
				v.Spec.Domain.IOThreadsPolicy = &shared
			},
			want: func(s *domainv1.DomainSpec) { s.Disks[0].Iothread = "iothread0" },
		},
		{
			name: "networkInterfaceMultiqueue: a virtio interface gets a queue pair per vCPU, an e1000 one",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 3}
				v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, v1alpha1.Interface{
					Name: "old", Model: "e1000", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}})
				v.Spec.Networks = append(v.Spec.Networks, v1alpha1.Network{Name: "old", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "br"}}})
			},
			inputs: func(in *assemble.Inputs) {
				in.Interfaces["old"] = &networkv1.InterfaceResult{Name: "old", TapName: "tapnet1", Mac: "02:00:00:00:00:02"}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 2, Cores: 3, Threads: 1}
				s.Nics[0].Queues = 6
				s.Nics = append(s.Nics, &domainv1.NIC{Name: "old", TapName: "tapnet1", Mac: "02:00:00:00:00:02", Model: "e1000"})
			},
		},
		{
			name: "networkInterfaceMultiqueue with one vCPU: one queue",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true) },
		},
		{
			name: "networkInterfaceMultiqueue: at most a tap's 256 queues",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 150}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 2, Cores: 150, Threads: 1}
				s.Nics[0].Queues = assemble.MaxNICQueues
			},
		},
		{
			name: "networkInterfaceMultiqueue false: one queue",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(false)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 4}
			},
			want: func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 4, Threads: 1} },
		},
		{
			name: "useVirtioTransitional",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.UseVirtioTransitional = ptr(true) },
			want: func(s *domainv1.DomainSpec) { s.VirtioTransitional = true },
		},
		{
			name: "useVirtioTransitional false: modern only, as unset",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.UseVirtioTransitional = ptr(false) },
		},
		{
			name: "no memory balloon",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.AutoattachMemBalloon = ptr(false) },
			want: func(s *domainv1.DomainSpec) { s.Balloon = nil },
		},
		{
			name: "host devices, acceleration, launcher",
			inputs: func(in *assemble.Inputs) {
				in.HostDevices = []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}}
				in.Acceleration = domainv1.Acceleration_ACCELERATION_EMULATED
				in.Sandbox.LauncherSocket = runDir + "/launcher.sock"
			},
			want: func(s *domainv1.DomainSpec) {
				s.HostDevices = []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}}
				s.Acceleration = domainv1.Acceleration_ACCELERATION_EMULATED
				s.Sandbox.LauncherSocket = runDir + "/launcher.sock"
			},
		},
		{
			name: "guest memory on huge pages in the sandbox's hugetlbfs",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			inputs: func(in *assemble.Inputs) { in.HugepagesDir = "/var/run/kubevisor-private/hugepages" },
			want: func(s *domainv1.DomainSpec) {
				s.Memory.Hugepages = &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/var/run/kubevisor-private/hugepages"}
			},
		},
		{
			name: "dedicated CPUs: vCPU i on the sandbox's i-th CPU, the emulator left alone",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 2, Threads: 1, DedicatedCPUPlacement: true}
			},
			inputs: func(in *assemble.Inputs) { in.CPUs, in.ExactCPUs = []uint32{4, 6}, true },
			want: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1, Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{4, 6}}}
			},
		},
		{
			name: "dedicated CPUs with the emulator isolated on the next CPU",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, DedicatedCPUPlacement: true, IsolateEmulatorThread: true}
			},
			inputs: func(in *assemble.Inputs) { in.CPUs, in.ExactCPUs = []uint32{1, 2, 3}, true },
			want: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 2, Cores: 1, Threads: 1, Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 2}, EmulatorHostCpus: []uint32{3}}}
			},
		},
		{
			name: "dedicated CPUs in a sandbox of more CPUs (standalone): the first ones",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true, IsolateEmulatorThread: true}
			},
			inputs: func(in *assemble.Inputs) { in.CPUs = []uint32{0, 1, 2, 3} },
			want: func(s *domainv1.DomainSpec) {
				s.Cpu.Pinning = &domainv1.CPUPinning{VcpuHostCpus: []uint32{0}, EmulatorHostCpus: []uint32{1}}
			},
		},
		{
			name: "NUMA passthrough: a guest node per host node of the pinned vCPUs, memory split in whole pages",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 3, DedicatedCPUPlacement: true,
					NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
				g := resource.MustParse("258Mi") // 129 pages: 65 on the first node, 64 on the second
				v.Spec.Domain.Memory.Guest = &g
			},
			inputs: func(in *assemble.Inputs) {
				in.HugepagesDir, in.CPUs = "/huge", []uint32{2, 5, 6}
				in.HostNUMANodes = map[uint32]uint32{0: 0, 2: 1, 4: 0, 5: 0, 6: 1}
			},
			want: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 258 << 20, Hugepages: &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/huge"}}
				s.Cpu = &domainv1.CPU{Sockets: 3, Cores: 1, Threads: 1,
					Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{2, 5, 6}},
					NumaCells: []*domainv1.NUMACell{
						{Vcpus: []uint32{1}, MemoryBytes: 65 * 2 << 20, HostNodes: []uint32{0}},
						{Vcpus: []uint32{0, 2}, MemoryBytes: 64 * 2 << 20, HostNodes: []uint32{1}},
					}}
			},
		},
		{
			name: "no namespace",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Namespace = "" },
			want: func(s *domainv1.DomainSpec) { s.Name = "demo" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmi, in, want := testVMI(), testInputs(), wantSpec()
			if tt.vmi != nil {
				tt.vmi(vmi)
			}
			if tt.inputs != nil {
				tt.inputs(&in)
			}
			if tt.want != nil {
				tt.want(want)
			}
			got, err := assemble.Domain(vmi, in)
			if err != nil {
				t.Fatalf("Domain: %v", err)
			}
			if !proto.Equal(want, got) {
				t.Errorf("Domain =\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
			}
		})
	}
}

func TestDomainRejects(t *testing.T) {
	tests := []struct {
		name   string
		vmi    func(*v1alpha1.VirtualMachineInstance)
		inputs func(*assemble.Inputs)
		// want are the "field: detail" parts the error must hold.
		want []string
	}{
		{
			name: "tpm persistent without a persistent state directory",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(true)}
			},
			want: []string{`spec.domain.devices.tpm.persistent: needs the VM's persistent state directory on the node, and none is given ("")`},
		},
		{
			name: "efi persistent with a relative persistent state directory",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{Persistent: ptr(true)}}}
			},
			inputs: func(in *assemble.Inputs) { in.PersistentStateDir = "state" },
			want:   []string{`spec.domain.firmware.bootloader.efi.persistent: needs the VM's persistent state directory on the node, and none is given ("state")`},
		},
		{
			name: "huge pages: a size x86_64 lacks",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "16Ki"}
			},
			inputs: func(in *assemble.Inputs) { in.HugepagesDir = "/huge" },
			want:   []string{`spec.domain.memory.hugepages.pageSize: "16Ki" is not supported (2Mi or 1Gi)`},
		},
		{
			name: "huge pages: guest memory not whole pages",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "1Gi"}
			},
			inputs: func(in *assemble.Inputs) { in.HugepagesDir = "/huge" },
			want:   []string{`spec.domain.memory.guest: 268435456 bytes is not a multiple of the huge page size 1Gi`},
		},
		{
			name: "huge pages: a sandbox without a hugetlbfs",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			want: []string{`spec.domain.memory.hugepages: the VMI's sandbox has no hugetlbfs of 2Mi pages`},
		},
		{
			name: "dedicated CPUs: a sandbox that does not say its CPUs",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
			},
			want: []string{`spec.domain.cpu.dedicatedCpuPlacement: the VMI's sandbox does not say which host CPUs it has`},
		},
		{
			name: "dedicated CPUs: too few in the sandbox",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, DedicatedCPUPlacement: true, IsolateEmulatorThread: true}
			},
			inputs: func(in *assemble.Inputs) { in.CPUs = []uint32{0, 1} },
			want:   []string{`spec.domain.cpu.dedicatedCpuPlacement: 3 dedicated host CPUs needed (one per vCPU and one for the emulator), and the VMI's sandbox has 2 (0-1)`},
		},
		{
			name: "dedicated CPUs: a launcher pod given the shared CPUs",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
			},
			inputs: func(in *assemble.Inputs) { in.CPUs, in.ExactCPUs = []uint32{0, 1, 2, 3, 6}, true },
			want:   []string{`spec.domain.cpu.dedicatedCpuPlacement: the launcher pod has host CPUs 0-3,6, not 1 of its own: the node's kubelet does not give exclusive CPUs`},
		},
		{
			name: "NUMA passthrough without dedicated CPUs",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			inputs: func(in *assemble.Inputs) { in.HugepagesDir = "/huge" },
			want:   []string{`spec.domain.cpu.numa.guestMappingPassthrough: requires cpu.dedicatedCpuPlacement and memory.hugepages`},
		},
		{
			name: "NUMA passthrough on a node that does not say its NUMA nodes",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true, NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			inputs: func(in *assemble.Inputs) { in.HugepagesDir, in.CPUs = "/huge", []uint32{3} },
			want:   []string{`spec.domain.cpu.numa.guestMappingPassthrough: the node does not say its NUMA nodes`},
		},
		{
			name: "NUMA passthrough: fewer huge pages than NUMA nodes",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, DedicatedCPUPlacement: true, NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "1Gi"}
				g := resource.MustParse("1Gi")
				v.Spec.Domain.Memory.Guest = &g
			},
			inputs: func(in *assemble.Inputs) {
				in.HugepagesDir, in.CPUs, in.HostNUMANodes = "/huge", []uint32{0, 1}, map[uint32]uint32{0: 0, 1: 1}
			},
			want: []string{`spec.domain.cpu.numa.guestMappingPassthrough: 1 huge pages of guest memory cannot be split among 2 NUMA nodes`},
		},
		{
			name: "apic disabled",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{APIC: &v1alpha1.FeatureAPIC{Enabled: ptr(false)}}
			},
			want: []string{`spec.domain.features.apic.enabled: an x86_64 guest always has a local APIC`},
		},
		{
			name: "disk options that cannot be",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				d := &v.Spec.Domain.Devices.Disks[0]
				d.IO, d.BlockSize = v1alpha1.IONative, &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 4096, Physical: 1000}}
				c := &v.Spec.Domain.Devices.Disks[1]
				c.DedicatedIOThread, c.BlockSize = ptr(true), &v1alpha1.BlockSize{}
			},
			want: []string{
				`spec.domain.devices.disks[0].io: native needs cache: none`,
				`spec.domain.devices.disks[0].blockSize.custom.physical: 1000 is not a power of two from 512 to 65536`,
				`spec.domain.devices.disks[0].blockSize.custom.logical: 4096 is larger than the physical block size 1000`,
				`spec.domain.devices.disks[1].dedicatedIOThread: only a virtio disk has an I/O thread of its own`,
				`spec.domain.devices.disks[1].blockSize.custom: required (matchVolume is not supported`,
			},
		},
		{
			name: "interface options that cannot be",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces,
					v1alpha1.Interface{Name: "second", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}})
				v.Spec.Networks = append(v.Spec.Networks, v1alpha1.Network{Name: "second", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}})
				a, b := &v.Spec.Domain.Devices.Interfaces[0], &v.Spec.Domain.Devices.Interfaces[1]
				a.PciAddress, a.ACPIIndex, a.State = "0000:00:05.0", 9, v1alpha1.InterfaceStateAbsent
				b.PciAddress, b.ACPIIndex = "0000:00:05.0", 9
			},
			inputs: func(in *assemble.Inputs) {
				in.Interfaces["second"] = &networkv1.InterfaceResult{Name: "second", TapName: "tap1", Mac: "02:00:00:00:00:02"}
			},
			want: []string{
				`spec.domain.devices.interfaces[0].state: absent (hot-unplug) is not supported`,
				`spec.domain.devices.interfaces[1].pciAddress: "0000:00:05.0" is also the address of spec.domain.devices.interfaces[0]`,
				`spec.domain.devices.interfaces[1].acpiIndex: 9 is also the ACPI index of spec.domain.devices.interfaces[0]`,
			},
		},
		{
			name: "a PCI address off the root bus, slot 0",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].PciAddress = "0000:00:00.0"
			},
			want: []string{`spec.domain.devices.interfaces[0].pciAddress: "0000:00:00.0": slot 0 is the host bridge's`},
		},
		{
			name: "supplementalPool without its size",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				p := v1alpha1.IOThreadsPolicySupplementalPool
				v.Spec.Domain.IOThreadsPolicy = &p
			},
			want: []string{`spec.domain.ioThreads.supplementalPoolThreadCount: required (> 0) with ioThreadsPolicy supplementalPool`},
		},
		{
			name: "acpi disabled on q35",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{ACPI: v1alpha1.FeatureState{Enabled: ptr(false)}}
			},
			want: []string{`spec.domain.features.acpi.enabled: a q35 machine always has ACPI: disabling it needs machine type pc`},
		},
		{
			name: "hyperv enlightenments without what they need",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{
					SyNIC: &v1alpha1.FeatureState{}, SyNICTimer: &v1alpha1.SyNICTimer{}, EVMCS: &v1alpha1.FeatureState{},
					Spinlocks: &v1alpha1.FeatureSpinlocks{Retries: ptr(uint32(100))},
				}}
			},
			want: []string{
				`spec.domain.features.hyperv.synic: needs vpindex`,
				`spec.domain.features.hyperv.synictimer: needs the hyperv timer (clock.timer.hyperv)`,
				`spec.domain.features.hyperv.evmcs: needs vapic`,
				`spec.domain.features.hyperv.spinlocks.spinlocks: 100 retries is fewer than the minimum of 4096`,
			},
		},
		{
			name: "clock: utc and timezone, rtc removed",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				tz := v1alpha1.ClockOffsetTimezone("")
				v.Spec.Domain.Clock = &v1alpha1.Clock{
					ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{}, Timezone: &tz},
					Timer:       &v1alpha1.Timer{RTC: &v1alpha1.RTCTimer{Enabled: ptr(false)}},
				}
			},
			want: []string{
				`spec.domain.clock: utc and timezone are mutually exclusive`,
				`spec.domain.clock.timezone: a time zone name is required`,
				`spec.domain.clock.timer.rtc.present: the real-time clock cannot be removed`,
			},
		},
		{
			name: "AMD SEV with BIOS",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.LaunchSecurity = &v1alpha1.LaunchSecurity{SEV: &v1alpha1.SEV{}}
			},
			want: []string{`spec.domain.launchSecurity.sev: needs EFI firmware (firmware.bootloader.efi with secureBoot: false)`},
		},
		{
			name: "AMD SEV with secure boot (EFI's default)",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
				v.Spec.Domain.LaunchSecurity = &v1alpha1.LaunchSecurity{SEV: &v1alpha1.SEV{}}
			},
			want: []string{`spec.domain.launchSecurity.sev: does not work with secure boot: set firmware.bootloader.efi.secureBoot to false`},
		},
		{
			name: "input and watchdog values",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Inputs = []v1alpha1.Input{{Name: "m", Type: "mouse", Bus: "ps2"}}
				v.Spec.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "w", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: "pause"}}
			},
			want: []string{
				`spec.domain.devices.inputs[0].type: "mouse" is not supported (tablet or keyboard)`,
				`spec.domain.devices.inputs[0].bus: "ps2" is not supported (usb or virtio)`,
				`spec.domain.devices.watchdog.i6300esb.action: "pause" is not supported (poweroff, reset or shutdown)`,
			},
		},
		{
			name: "volume not prepared",
			inputs: func(in *assemble.Inputs) {
				delete(in.Disks, "cloudinit")
			},
			want: []string{`spec.domain.devices.disks[1]: volume "cloudinit" not prepared`},
		},
		{
			name: "disk without a volume",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[1].Name = "missing"
			},
			want: []string{`spec.domain.devices.disks[1].name: no volume "missing" in spec.volumes`},
		},
		{
			name: "interface not set up",
			inputs: func(in *assemble.Inputs) {
				in.Interfaces = nil
			},
			want: []string{`spec.domain.devices.interfaces[0]: interface "default" not set up`},
		},
		{
			name: "interface without a network",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Networks = nil
			},
			want: []string{`spec.domain.devices.interfaces[0].name: no network "default" in spec.networks`},
		},
		{
			name: "interface without a binding",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].Masquerade = nil
			},
			want: []string{`spec.domain.devices.interfaces[0]: a binding is required; bindings other than bridge and masquerade are not supported`},
		},
		{
			name: "masquerade on multus",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Networks[0].NetworkSource = v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "net-a"}}
			},
			want: []string{`spec.domain.devices.interfaces[0].masquerade: not supported on a multus network`},
		},
		{
			name: "no memory",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory = nil
			},
			want: []string{`spec.domain.memory.guest: required`},
		},
		{
			name: "too many vcpus",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 64, Cores: 64}
			},
			want: []string{`spec.domain.cpu: 4096 vCPUs`},
		},
		{
			name: "too many vcpus from the cpu request",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("600")}
			},
			want: []string{`spec.domain.resources.requests.cpu: 600 vCPUs exceed the maximum of 512`},
		},
		{
			name: "negative cpu limit",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("-2")}
				v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
			},
			want: []string{`spec.domain.resources.limits.cpu: -2 is negative`},
		},
		{
			name: "duplicate boot order",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].BootOrder = ptr(uint(1))
			},
			want: []string{`spec.domain.devices.interfaces[0].bootOrder: boot order 1 is also used by spec.domain.devices.disks[0]`},
		},
		{
			name: "kernel boot not resolved",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{Image: "k"}}}
			},
			want: []string{`spec.domain.firmware.kernelBoot: the kernel of the kernel boot container is not resolved`},
		},
		{
			name: "kernel boot with efi",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{
					Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}},
					KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{Image: "k"}},
				}
			},
			inputs: func(in *assemble.Inputs) { in.Kernel = &assemble.KernelArtifacts{KernelPath: "/k"} },
			want:   []string{`spec.domain.firmware.kernelBoot: not supported together with bootloader.efi`},
		},
		{
			name: "lun on sata",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSATA}}
			},
			want: []string{`spec.domain.devices.disks[0].lun.bus: "sata" is not supported (a lun is on scsi)`},
		},
		{
			name: "open tray",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[1].CDRom.Tray = v1alpha1.TrayStateOpen
			},
			want: []string{`spec.domain.devices.disks[1].cdrom.tray: open is not supported`},
		},
		{
			name: "no uid, no run dir",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.UID = "" },
			inputs: func(in *assemble.Inputs) {
				in.RunDir = ""
			},
			want: []string{`metadata.uid: required`, `runDir: an absolute run directory is required`},
		},
		{
			name: "a relative path from the storage driver",
			inputs: func(in *assemble.Inputs) {
				in.Disks["root"].Path = "root.qcow2"
			},
			want: []string{`domain spec: invalid domain spec: disks[0].path: must be an absolute path`},
		},
		{
			name: "every problem at once",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory = nil
				v.Spec.Networks = nil
			},
			inputs: func(in *assemble.Inputs) { delete(in.Disks, "root") },
			want: []string{
				`spec.domain.memory.guest: required`,
				`spec.domain.devices.disks[0]: volume "root" not prepared`,
				`spec.domain.devices.interfaces[0].name: no network "default"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmi, in := testVMI(), testInputs()
			if tt.vmi != nil {
				tt.vmi(vmi)
			}
			if tt.inputs != nil {
				tt.inputs(&in)
			}
			spec, err := assemble.Domain(vmi, in)
			if err == nil {
				t.Fatalf("Domain accepted the VMI: %v", spec)
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("code = %v, want InvalidArgument", status.Code(err))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestDomainDoesNotShareInputs(t *testing.T) {
	vmi, in := testVMI(), testInputs()
	spec, err := assemble.Domain(vmi, in)
	if err != nil {
		t.Fatal(err)
	}
	spec.Labels["app"] = "changed"
	if vmi.Labels["app"] != "demo" {
		t.Errorf("the spec's labels are the VMI's map")
	}
	if !proto.Equal(in.Sandbox, &domainv1.Sandbox{NetnsPath: "/run/netns/kv-6a1f0c1e"}) {
		t.Errorf("inputs changed: %v", in.Sandbox)
	}
}

func TestCheckInterface(t *testing.T) {
	vmi := testVMI()
	if fe := assemble.CheckInterface(vmi, 0); fe != nil {
		t.Fatalf("CheckInterface = %v", fe)
	}
	if got := assemble.Binding(&vmi.Spec.Domain.Devices.Interfaces[0]); got != assemble.BindingMasquerade {
		t.Errorf("Binding = %q", got)
	}
}
