package handler

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

func ptr[T any](v T) *T { return &v }

func TestMakePlan(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "image")
	if err := os.MkdirAll(filepath.Join(image, "disk"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "disk", "cirros.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := MapResolver{
		Images: map[string]string{"quay.io/kubevirt/cirros:latest": image, "kernels:1": "/var/lib/kernels"},
		Claims: map[string]string{"default/disk-pvc": "/dev/vg0/disk", "golden": "/var/lib/golden.img"},
	}
	vmi := testVMI("demo", "uid-plan", "/images/root.qcow2")
	vmi.Spec.Hostname = "guest"
	vmi.Spec.Volumes = append(vmi.Spec.Volumes,
		v1alpha1.Volume{Name: "cirros", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "quay.io/kubevirt/cirros:latest", Path: "/disk/cirros.img"}}},
		v1alpha1.Volume{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
		v1alpha1.Volume{Name: "host", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/data/d.img", Type: v1alpha1.HostDiskExistsOrCreate, Capacity: resource.MustParse("2Gi"), Shared: ptr(true)}}},
		v1alpha1.Volume{Name: "pvc", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "disk-pvc", ReadOnly: true}}}},
		v1alpha1.Volume{Name: "eph", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}},
		v1alpha1.Volume{Name: "cd", VolumeSource: v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
			UserDataBase64: base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n")), NetworkData: "version: 2\n"}}},
	)
	vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, v1alpha1.Interface{
		Name: "sec", MacAddress: "02:00:00:00:00:09", Model: "e1000",
		InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}},
	})
	// Multi-queue: the virtio interface's tap gets a queue per vCPU, the e1000's one.
	vmi.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
	vmi.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2}
	vmi.Spec.Domain.Devices.Interfaces[0].Ports = []v1alpha1.Port{{Name: "http", Protocol: "TCP", Port: 80}}
	vmi.Spec.Networks = append(vmi.Spec.Networks, v1alpha1.Network{Name: "sec", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "ns/net-a"}}})
	vmi.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{KernelArgs: "console=ttyS0", Container: &v1alpha1.KernelBootContainer{
		Image: "kernels:1", KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd"}}}

	p, err := makePlan(context.Background(), vmi, r)
	if err != nil {
		t.Fatalf("makePlan: %v", err)
	}
	wantVolumes := []*storagev1.Volume{
		{Name: "containerdisk", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "/images/root.qcow2", Path: "/images/root.qcow2"}}},
		{Name: "cloudinitdisk", Source: &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: &storagev1.CloudInit{UserData: []byte("#cloud-config\n"), Hostname: "guest"}}},
		{Name: "cirros", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "quay.io/kubevirt/cirros:latest", Path: filepath.Join(image, "disk", "cirros.img")}}},
		{Name: "scratch", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1 << 30}}},
		{Name: "host", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: "/data/d.img", Type: "DiskOrCreate", CapacityBytes: 2 << 30, Shared: true}}},
		{Name: "pvc", Source: &storagev1.Volume_PersistentVolumeClaim{PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{ClaimName: "disk-pvc", Path: "/dev/vg0/disk", ReadOnly: true}}},
		{Name: "eph", Source: &storagev1.Volume_Ephemeral{Ephemeral: &storagev1.Ephemeral{BackingPath: "/var/lib/golden.img"}}},
		{Name: "cd", Source: &storagev1.Volume_CloudInitConfigDrive{CloudInitConfigDrive: &storagev1.CloudInit{UserData: []byte("#!/bin/sh\necho hi\n"), NetworkData: []byte("version: 2\n"), Hostname: "guest"}}},
	}
	if len(p.volumes) != len(wantVolumes) {
		t.Fatalf("volumes = %v", p.volumes)
	}
	for i := range wantVolumes {
		if !proto.Equal(p.volumes[i], wantVolumes[i]) {
			t.Errorf("volume %d = %s, want %s", i, prototext.Format(p.volumes[i]), prototext.Format(wantVolumes[i]))
		}
	}
	wantIfaces := []*networkv1.Interface{
		{Name: "default", Binding: "masquerade", Ports: []*networkv1.Port{{Name: "http", Protocol: "TCP", Port: 80}}, Queues: 2},
		{Name: "sec", Binding: "bridge", NetworkName: "ns/net-a", Mac: "02:00:00:00:00:09"},
	}
	for i := range wantIfaces {
		if i >= len(p.interfaces) || !proto.Equal(p.interfaces[i], wantIfaces[i]) {
			t.Errorf("interfaces = %v, want %v", p.interfaces, wantIfaces)
			break
		}
	}
	if p.kernel == nil || p.kernel.KernelPath != "/var/lib/kernels/boot/vmlinuz" || p.kernel.InitrdPath != "/var/lib/kernels/boot/initrd" {
		t.Errorf("kernel = %+v", p.kernel)
	}
}

func TestMakePlanRejects(t *testing.T) {
	vmi := testVMI("demo", "uid-plan", "not/a/path")
	vmi.Spec.Volumes = append(vmi.Spec.Volumes,
		v1alpha1.Volume{Name: "pvc", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "nope"}, Hotpluggable: true}}},
		v1alpha1.Volume{Name: "two", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}, HostDisk: &v1alpha1.HostDisk{Path: "/x"}}},
		v1alpha1.Volume{Name: "ci", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "a", UserDataBase64: "YQ=="}}},
		v1alpha1.Volume{Name: "b64", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{NetworkDataBase64: "!!"}}},
	)
	_, err := makePlan(context.Background(), vmi, MapResolver{})
	if err == nil {
		t.Fatal("makePlan accepted the VMI")
	}
	for _, want := range []string{
		`spec.volumes[0].containerDisk.image: image "not/a/path": not found on this node`,
		`spec.volumes[2].persistentVolumeClaim.claimName: persistentVolumeClaim "nope": not found`,
		`spec.volumes[2].persistentVolumeClaim.hotpluggable: not supported`,
		`spec.volumes[3]: exactly one volume source must be set, not 2`,
		`spec.volumes[4].cloudInitNoCloud: more than one source of userData`,
		`spec.volumes[5].cloudInitNoCloud.networkDataBase64: not base64`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// allDevices is every optional device of the domain spec.
func allDevices() []string {
	var names []string
	for _, d := range driver.OptionalDevices {
		names = append(names, d.Name)
	}
	return names
}

func TestCheckSupported(t *testing.T) {
	full := driverCaps{
		hypervisor: "hv", network: "net", storage: "st",
		hypervisorCaps: &basev1.Capabilities{
			Firmware: []string{"bios", "efi", "kernel"}, DiskBuses: []string{"virtio", "sata", "scsi"}, NicModels: []string{"virtio", "e1000"},
			MachineTypes: []string{"q35", "pc-q35-*"}, SecureBoot: true, Vnc: true, Devices: allDevices(),
			Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC}, PersistentState: true,
		},
		networkCaps: &basev1.Capabilities{Bindings: []string{"bridge", "masquerade"}, MultiQueueTaps: true},
		stCaps:      &basev1.Capabilities{VolumeTypes: []string{"containerDisk", "cloudInitNoCloud"}},
	}
	tests := []struct {
		name string
		vmi  func(*v1alpha1.VirtualMachineInstance)
		caps func(*driverCaps)
		want []string
	}{
		{name: "supported"},
		{
			name: "nothing declared",
			caps: func(c *driverCaps) {
				c.hypervisorCaps, c.networkCaps, c.stCaps = &basev1.Capabilities{}, &basev1.Capabilities{}, &basev1.Capabilities{}
			},
			want: []string{
				`spec.domain.firmware.bootloader: firmware "bios" is not supported by the hypervisor driver "hv" (it supports: none)`,
				`spec.domain.devices.disks[0].disk.bus: disk bus "virtio" is not supported`,
				`spec.domain.devices.disks[1].cdrom.bus: disk bus "scsi" is not supported`,
				`spec.domain.devices.interfaces[0].model: interface model "virtio" is not supported`,
				`spec.domain.devices.interfaces[0].masquerade: binding "masquerade" is not supported by the network driver "net"`,
				`spec.volumes[0].containerDisk: volume type "containerDisk" is not supported by the storage driver "st"`,
			},
		},
		{
			name: "usb bus, rtl8139, efi, emptyDisk",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[0].Disk.Bus = v1alpha1.DiskBusUSB
				v.Spec.Domain.Devices.Interfaces[0].Model = "rtl8139"
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
				v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "e", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}})
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Firmware = []string{"bios"} },
			want: []string{
				`spec.domain.devices.disks[0].disk.bus: disk bus "usb" is not supported by the hypervisor driver "hv" (it supports: virtio, sata, scsi)`,
				`spec.domain.devices.interfaces[0].model: interface model "rtl8139" is not supported`,
				`spec.domain.firmware.bootloader: firmware "efi" is not supported`,
				`spec.volumes[2].emptyDisk: volume type "emptyDisk" is not supported`,
			},
		},
		{
			name: "versioned machine type declared by prefix",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Machine = &v1alpha1.Machine{Type: "pc-q35-7.2"}
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
			},
		},
		{
			name: "machine type, Secure Boot and VNC not declared",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Machine = &v1alpha1.Machine{Type: "pc"}
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.SecureBoot, c.hypervisorCaps.Vnc = false, false },
			want: []string{
				`spec.domain.machine.type: machine type "pc" is not supported by the hypervisor driver "hv" (it supports: q35, pc-q35-*)`,
				`spec.domain.firmware.bootloader.efi.secureBoot: Secure Boot is not supported by the hypervisor driver "hv"`,
				`spec.domain.devices.autoattachGraphicsDevice: a VNC console is not supported by the hypervisor driver "hv"`,
			},
		},
		{
			name: "persistent TPM and EFI declared",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(true)}
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{Persistent: ptr(true)}}}
			},
		},
		{
			name: "persistent TPM and EFI not declared",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(true)}
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{Persistent: ptr(true)}}}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.PersistentState = false },
			want: []string{
				`spec.domain.devices.tpm.persistent: a persistent TPM is not supported by the hypervisor driver "hv" (it does not declare Capabilities.persistent_state)`,
				`spec.domain.firmware.bootloader.efi.persistent: a persistent EFI variable store is not supported by the hypervisor driver "hv"`,
			},
		},
		{
			name: "a TPM that keeps nothing asks nothing of persistent_state",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(false)}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.PersistentState = false },
		},
		{
			name: "rng offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.Rng = &v1alpha1.Rng{} },
		},
		{
			name: "rng not offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.Rng = &v1alpha1.Rng{} },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = nil },
			want: []string{`spec.domain.devices.rng: a virtio entropy device is not supported by the hypervisor driver "hv" (it offers the devices: none)`},
		},
		{
			name: "lun offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{}}
			},
		},
		{
			name: "lun not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{}}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{`spec.domain.devices.disks[0].lun: a lun (SCSI passthrough) is not supported by the hypervisor driver "hv" (it offers the devices: balloon)`},
		},
		{
			name: "chassis not offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Chassis = &v1alpha1.Chassis{Serial: "s"} },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"rng", "balloon"} },
			want: []string{`spec.domain.chassis: SMBIOS chassis information is not supported by the hypervisor driver "hv" (it offers the devices: rng, balloon)`},
		},
		{
			name: "the default memory balloon not offered",
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"rng"} },
			want: []string{`spec.domain.devices.autoattachMemBalloon: a memory balloon (attached by default: set autoattachMemBalloon: false) is not supported by the hypervisor driver "hv" (it offers the devices: rng)`},
		},
		{
			name: "no memory balloon asked for, none offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.AutoattachMemBalloon = ptr(false) },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = nil },
		},
		{
			name: "dedicated CPUs offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
			},
		},
		{
			name: "dedicated CPUs not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true, IsolateEmulatorThread: true}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{`spec.domain.cpu.dedicatedCpuPlacement: pinning vCPUs to dedicated host CPUs is not supported by the hypervisor driver "hv" (it offers the devices: balloon)`},
		},
		{
			name: "NUMA passthrough not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true, NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			caps: func(c *driverCaps) {
				c.hypervisorCaps.Devices = []string{driver.DeviceCPUPinning, driver.DeviceHugepages}
			},
			want: []string{`spec.domain.cpu.numa.guestMappingPassthrough: a guest NUMA topology is not supported by the hypervisor driver "hv" (it offers the devices: cpu-pinning, hugepages)`},
		},
		{
			name: "hugepages offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
		},
		{
			name: "hugepages not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{`spec.domain.memory.hugepages: guest memory on huge pages is not supported by the hypervisor driver "hv" (it offers the devices: balloon)`},
		},
		{
			name: "features, clock, inputs and watchdog not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{}
				v.Spec.Domain.Clock = &v1alpha1.Clock{}
				v.Spec.Domain.Devices.AutoattachInputDevice = ptr(true)
				v.Spec.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd"}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{
				`spec.domain.features: setting platform features is not supported by the hypervisor driver "hv"`,
				`spec.domain.clock: setting the clock and timers is not supported`,
				`spec.domain.devices.inputs: an input device (or autoattachInputDevice) is not supported`,
				`spec.domain.devices.watchdog: a watchdog is not supported`,
			},
		},
		{
			name: "tpm not offered (no swtpm on the node)",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{} },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{`spec.domain.devices.tpm: a TPM (swtpm is not installed on the node, or the driver has no TPM) is not supported by the hypervisor driver "hv" (it offers the devices: balloon)`},
		},
		{
			name: "tpm disabled, none offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr(false)}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
		},
		{
			name: "tpm offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{} },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon", "tpm"} },
		},
		{
			name: "networkInterfaceMultiqueue with two vCPUs, offered by both drivers",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2}
			},
		},
		{
			name: "networkInterfaceMultiqueue offered by neither driver",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2}
			},
			caps: func(c *driverCaps) {
				c.hypervisorCaps.Devices = []string{"balloon"}
				c.networkCaps = &basev1.Capabilities{Bindings: []string{"masquerade"}}
			},
			want: []string{
				`spec.domain.devices.networkInterfaceMultiqueue: a virtio interface with a queue pair per vCPU is not supported by the hypervisor driver "hv" (it offers the devices: balloon)`,
				`spec.domain.devices.networkInterfaceMultiqueue: multi-queue taps are not supported by the network driver "net"`,
			},
		},
		{
			name: "networkInterfaceMultiqueue with one vCPU, or on an e1000: one queue, which every driver gives",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr(true)
				v.Spec.Domain.Devices.Interfaces[0].Model = "e1000"
			},
			caps: func(c *driverCaps) {
				c.hypervisorCaps.Devices = []string{"balloon"}
				c.networkCaps = &basev1.Capabilities{Bindings: []string{"masquerade"}}
			},
		},
		{
			name: "useVirtioTransitional not offered",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.UseVirtioTransitional = ptr(true) },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
			want: []string{`spec.domain.devices.useVirtioTransitional: making the virtio devices transitional (legacy and modern) is not supported by the hypervisor driver "hv"`},
		},
		{
			name: "useVirtioTransitional false: modern virtio, which asks nothing of the driver",
			vmi:  func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.UseVirtioTransitional = ptr(false) },
			caps: func(c *driverCaps) { c.hypervisorCaps.Devices = []string{"balloon"} },
		},
		{
			name: "DHCP options offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].DHCPOptions = &v1alpha1.DHCPOptions{BootFileName: "boot.ipxe"}
			},
			caps: func(c *driverCaps) {
				c.networkCaps = &basev1.Capabilities{Bindings: []string{"bridge", "masquerade"}, InterfaceOptions: []string{"dhcp-options"}}
			},
		},
		{
			name: "probes through the guest agent offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
				v.Spec.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
			},
		},
		{
			name: "probes through the guest agent not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
				v.Spec.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
			},
			caps: func(c *driverCaps) {
				c.hypervisorCaps.Features = []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT}
			},
			want: []string{
				`spec.livenessProbe.exec: a probe through the guest agent is not supported by the hypervisor driver "hv" (it does not declare FEATURE_HYPERVISOR_GUEST_EXEC)`,
				`spec.readinessProbe.guestAgentPing: a probe through the guest agent is not supported by the hypervisor driver "hv"`,
			},
		},
		{
			name: "a tcpSocket probe asks nothing of the hypervisor driver",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}}}
			},
			caps: func(c *driverCaps) { c.hypervisorCaps.Features = nil },
		},
		{
			name: "DHCP options not offered",
			vmi: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].DHCPOptions = &v1alpha1.DHCPOptions{NTPServers: []string{"192.0.2.1"}}
			},
			want: []string{`spec.domain.devices.interfaces[0].dhcpOptions: sending the guest extra DHCP options is not supported by the network driver "net" (it offers the interface options: none)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmi := testVMI("demo", "uid", "/images/root.qcow2")
			if tt.vmi != nil {
				tt.vmi(vmi)
			}
			c := full
			c.hypervisorCaps = proto.CloneOf(full.hypervisorCaps)
			if tt.caps != nil {
				tt.caps(&c)
			}
			p, err := makePlan(context.Background(), vmi, MapResolver{})
			if err != nil {
				t.Fatal(err)
			}
			spec, err := assemble.Domain(vmi, standIns(p, domainv1.Acceleration_ACCELERATION_AUTO, 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			err = checkSupported(vmi, spec, p, c)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("checkSupported: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("checkSupported accepted the VMI")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "handler.yaml")
	if err := os.WriteFile(path, []byte(`
pluginDir: plugins
stateDir: /var/lib/kv
runDir: run
nodeName: node-1
drivers: {hypervisor: qmp, network: cni, storage: local}
driverConfig:
  qmp: {disableKVM: true}
acceleration: emulated
cdromBus: scsi
images:
  kubevisor/test-guest:latest: guest/disk.qcow2
resyncPeriod: 10s
standalone:
  cniBinDir: [cni/bin]
  subnet: 10.244.254.0/24
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	if c.PluginDir != filepath.Join(dir, "plugins") || c.StateDir != "/var/lib/kv" || c.RunDir != filepath.Join(dir, "run") ||
		c.Images["kubevisor/test-guest:latest"] != filepath.Join(dir, "guest/disk.qcow2") || c.Standalone.CNIBinDir[0] != filepath.Join(dir, "cni/bin") ||
		string(c.DriverConfig["qmp"]) != `{"disableKVM":true}` || c.ResyncPeriod.Duration.String() != "10s" || c.Drivers.Network != "cni" {
		t.Errorf("config = %+v", c)
	}
	c, err = c.withDefaults()
	if err != nil || c.VolumeDir != "/var/lib/kv/volumes" {
		t.Errorf("withDefaults = %+v, %v", c, err)
	}

	if err := os.WriteFile(path, []byte("drivers: {hypervisor: qmp}\nstatedir: /x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), `unknown field "statedir"`) {
		t.Errorf("LoadConfig of a misspelt field = %v", err)
	}
	if _, err := (Config{Acceleration: "fast", DiskBus: "ide"}).withDefaults(); err == nil ||
		!strings.Contains(err.Error(), "acceleration") || !strings.Contains(err.Error(), "diskBus") {
		t.Errorf("withDefaults of bad values = %v", err)
	}
}

// TestPlanDHCPOptions: an interface's DHCP options reach the network driver's request as they
// are, and an interface without any sends none.
func TestPlanDHCPOptions(t *testing.T) {
	vmi := testVMI("demo", "uid", "/images/root.qcow2")
	p, err := makePlan(context.Background(), vmi, MapResolver{})
	if err != nil {
		t.Fatal(err)
	}
	if o := p.interfaces[0].GetDhcpOptions(); o != nil {
		t.Errorf("DHCP options %v of an interface without any", o)
	}
	vmi.Spec.Domain.Devices.Interfaces[0].DHCPOptions = &v1alpha1.DHCPOptions{
		BootFileName: "pxelinux.0", TFTPServerName: "192.0.2.9", NTPServers: []string{"192.0.2.1", "192.0.2.2"},
		PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 224, Value: "a"}, {Option: 254, Value: "b"}},
	}
	if p, err = makePlan(context.Background(), vmi, MapResolver{}); err != nil {
		t.Fatal(err)
	}
	want := &networkv1.DHCPOptions{
		BootFileName: "pxelinux.0", TftpServerName: "192.0.2.9", NtpServers: []string{"192.0.2.1", "192.0.2.2"},
		PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 224, Value: "a"}, {Code: 254, Value: "b"}},
	}
	if got := p.interfaces[0].GetDhcpOptions(); !proto.Equal(got, want) {
		t.Errorf("DHCP options %v, want %v", got, want)
	}
}

// TestVMIInterfaceSettingsNameEveryOptionalSetting: every optional interface setting has the
// words its refusal uses.
func TestVMIInterfaceSettingsNameEveryOptionalSetting(t *testing.T) {
	for _, o := range driver.OptionalInterfaceSettings {
		if vmiInterfaceSettings[o.Name] == "" {
			t.Errorf("optional interface setting %q has no description in vmiInterfaceSettings", o.Name)
		}
	}
}

// TestVMIDevicesNameEveryOptionalDevice: every optional device of the domain spec has the VMI
// field its refusal names.
func TestVMIDevicesNameEveryOptionalDevice(t *testing.T) {
	for _, d := range driver.OptionalDevices {
		if v := vmiDevices[d.Name]; v.field == "" || v.what == "" {
			t.Errorf("optional device %q has no VMI field and description in vmiDevices", d.Name)
		}
	}
}

// The persistentVolumeClaim volume's capacity_bytes is its claim's capacity from
// status.volumeStatus less the file-system overhead (the default when none is given), exactly;
// 0 when the status has no capacity for that volume's claim; a bad overhead is an error at its
// status field.
func TestMakePlanClaimCapacity(t *testing.T) {
	r := MapResolver{Claims: map[string]string{"data": "/claims/data"}}
	info := func(capacity, overhead string) *v1alpha1.PersistentVolumeClaimInfo {
		i := &v1alpha1.PersistentVolumeClaimInfo{ClaimName: "data", FilesystemOverhead: overhead}
		if capacity != "" {
			i.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
		}
		return i
	}
	for _, tt := range []struct {
		name    string
		status  []v1alpha1.VolumeStatus
		want    int64
		wantErr string
	}{
		{"no status", nil, 0, ""},
		{"default overhead", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("10Gi", "")}}, 10737418240 * 945 / 1000, ""},
		{"given overhead", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("1000", "0.1")}}, 900, ""},
		{"no overhead", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("1Gi", "0")}}, 1 << 30, ""},
		{"rounded down", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("1001", "0.055")}}, 945, ""},
		{"other volume", []v1alpha1.VolumeStatus{{Name: "other", PersistentVolumeClaimInfo: info("1Gi", "")}}, 0, ""},
		{"other claim", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{ClaimName: "old",
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}, 0, ""},
		{"no capacity", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("", "")}}, 0, ""},
		{"no claim info", []v1alpha1.VolumeStatus{{Name: "pvc"}}, 0, ""},
		{"second entry", []v1alpha1.VolumeStatus{{Name: "root"}, {Name: "pvc", PersistentVolumeClaimInfo: info("2Mi", "0.5")}}, 1 << 20, ""},
		{"overhead 1", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("1Gi", "1")}}, 0, "status.volumeStatus[0].persistentVolumeClaimInfo.filesystemOverhead"},
		{"overhead not a number", []v1alpha1.VolumeStatus{{Name: "root"}, {Name: "pvc", PersistentVolumeClaimInfo: info("1Gi", "5%")}}, 0, "status.volumeStatus[1].persistentVolumeClaimInfo.filesystemOverhead"},
		{"negative overhead", []v1alpha1.VolumeStatus{{Name: "pvc", PersistentVolumeClaimInfo: info("1Gi", "-0.1")}}, 0, "filesystemOverhead"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vmi := testVMI("demo", "uid-cap", "/images/root.qcow2")
			vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: "pvc", VolumeSource: v1alpha1.VolumeSource{
				PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}})
			vmi.Status.VolumeStatus = tt.status
			p, err := makePlan(context.Background(), vmi, r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one at %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("makePlan: %v", err)
			}
			var got *storagev1.PersistentVolumeClaim
			for _, v := range p.volumes {
				if v.GetName() == "pvc" {
					got = v.GetPersistentVolumeClaim()
				}
			}
			if got == nil || got.GetPath() != "/claims/data" || got.GetCapacityBytes() != tt.want {
				t.Errorf("volume %v, want capacity_bytes %d", got, tt.want)
			}
		})
	}
}

func TestMapResolverPersistentState(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	r := MapResolver{StateDir: state}
	vmi := testVMI("demo", "uid-1", "/images/root.qcow2")
	vmi.Namespace = "team"
	dir, err := r.PersistentState(ctx, vmi)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(state, PersistentStateDirName, "team", "demo"); dir != want {
		t.Fatalf("dir %q, want %q", dir, want)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir %v, %v: want a directory of mode 0700", fi, err)
	}
	// A later VMI of the same name (another UID) finds what the first left, as it was.
	if err := os.WriteFile(filepath.Join(dir, "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	vmi.UID = "uid-2"
	again, err := r.PersistentState(ctx, vmi)
	if err != nil || again != dir {
		t.Fatalf("second VMI: %q, %v; want %q", again, err, dir)
	}
	if _, err := os.Stat(filepath.Join(again, "kept")); err != nil {
		t.Errorf("the first VMI's state is gone: %v", err)
	}
	// Another namespace's VMI of the same name has its own.
	vmi.Namespace = "other"
	if other, err := r.PersistentState(ctx, vmi); err != nil || other == dir {
		t.Errorf("another namespace: %q, %v; want a directory other than %q", other, err, dir)
	}
	for _, bad := range []string{"..", "a/b"} {
		vmi.Name = bad
		if d, err := r.PersistentState(ctx, vmi); err == nil {
			t.Errorf("name %q: %q, want an error", bad, d)
		}
	}
	if d, err := (MapResolver{}).PersistentState(ctx, vmi); err == nil {
		t.Errorf("no state directory: %q, want an error", d)
	}
}
