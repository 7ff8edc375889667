package webhook

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// minimalSpec is a valid spec before defaulting: a container disk, memory, nothing else.
func minimalSpec() *v1alpha1.VirtualMachineInstanceSpec {
	return &v1alpha1.VirtualMachineInstanceSpec{
		Domain: v1alpha1.DomainSpec{
			Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}},
			Devices: v1alpha1.Devices{
				Disks: []v1alpha1.Disk{{Name: "root"}},
			},
		},
		Volumes: []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
			ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/cirros:latest"},
		}}},
	}
}

// validSpec is minimalSpec defaulted, as the validating webhook sees it.
func validSpec() *v1alpha1.VirtualMachineInstanceSpec {
	s := minimalSpec()
	Default(s, DefaultOptions{})
	return s
}

func cloudInitVolume(name string, ci *v1alpha1.CloudInitNoCloudSource) v1alpha1.Volume {
	return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: ci}}
}

// withCloudInit adds a disk and a NoCloud volume "ci".
func withCloudInit(s *v1alpha1.VirtualMachineInstanceSpec, ci *v1alpha1.CloudInitNoCloudSource) {
	s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "ci", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: "virtio"}}})
	s.Volumes = append(s.Volumes, cloudInitVolume("ci", ci))
}

// TestValidate has one row per rule: the change to a valid spec, and the field path and words
// of the rejection (empty field: accepted).
func TestValidate(t *testing.T) {
	big := strings.Repeat("x", MaxCloudInitUserDataBytes+1)
	tests := []struct {
		name   string
		change func(s *v1alpha1.VirtualMachineInstanceSpec)
		field  string
		detail string
	}{
		{name: "defaulted minimal spec", change: func(*v1alpha1.VirtualMachineInstanceSpec) {}},

		// Names unique.
		{name: "duplicate disk name", field: "spec.domain.devices.disks[1].name", detail: "Duplicate value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, s.Domain.Devices.Disks[0])
			}},
		{name: "duplicate volume name", field: "spec.volumes[1].name", detail: "Duplicate value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = append(s.Volumes, s.Volumes[0]) }},
		{name: "duplicate interface name", field: "spec.domain.devices.interfaces[1].name", detail: "Duplicate value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, s.Domain.Devices.Interfaces[0])
			}},
		{name: "duplicate network name", field: "spec.networks[1].name", detail: "Duplicate value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Networks = append(s.Networks, s.Networks[0]) }},
		{name: "volume name not a DNS label", field: "spec.volumes[0].name", detail: "RFC 1123",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].Name, s.Domain.Devices.Disks[0].Name = "Root_Disk", "Root_Disk"
			}},

		// Architecture and start strategy.
		{name: "arm64", field: "spec.architecture", detail: "Unsupported value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Architecture = "arm64" }},
		{name: "amd64 and started paused", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			p := v1alpha1.StartStrategyPaused
			s.Architecture, s.StartStrategy = "amd64", &p
		}},

		// Platform: clock, features, inputs (the last two through core/domain/assemble).
		{name: "unknown time zone", field: "spec.domain.clock.timezone", detail: "not a time zone of the tz database",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				tz := v1alpha1.ClockOffsetTimezone("Mars/Olympus")
				s.Domain.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{Timezone: &tz}}
			}},
		{name: "a time zone", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			tz := v1alpha1.ClockOffsetTimezone("America/New_York")
			s.Domain.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{Timezone: &tz}}
		}},
		{name: "apic disabled", field: "spec.domain.features.apic.enabled", detail: "always has a local APIC",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				no := false
				s.Domain.Features = &v1alpha1.Features{APIC: &v1alpha1.FeatureAPIC{Enabled: &no}}
			}},
		{name: "synic without vpindex", field: "spec.domain.features.hyperv.synic", detail: "needs vpindex",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{SyNIC: &v1alpha1.FeatureState{}}}
			}},
		{name: "inputs and a watchdog", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.Inputs = []v1alpha1.Input{{Name: "t", Type: v1alpha1.InputTypeTablet, Bus: v1alpha1.InputBusVirtio}}
			s.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "w", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: v1alpha1.WatchdogActionShutdown}}
		}},

		// Multi-queue interfaces and transitional virtio: the queues are capped, not refused;
		// a non-virtio interface keeps one queue (KubeVirt's).
		{name: "networkInterfaceMultiqueue on virtio and e1000 interfaces, useVirtioTransitional", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			yes := true
			s.Domain.Devices.NetworkInterfaceMultiQueue, s.Domain.Devices.UseVirtioTransitional = &yes, &yes
			s.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 200, Threads: 1}
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, v1alpha1.Interface{Name: "old", Model: "e1000",
				InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}})
			s.Networks = append(s.Networks, v1alpha1.Network{Name: "old", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "br"}}})
		}},

		// Disks and volumes.
		{name: "gpus and host devices", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g", DeviceName: "devices.kubevisor.io/gpu"}}
			s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "h", DeviceName: "nvidia.com/GA102"}}
		}},
		{name: "host device deviceName not an extended resource", field: "spec.domain.devices.hostDevices[0].deviceName", detail: "not an extended resource name",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "h", DeviceName: "gpu"}}
			}},
		{name: "gpu and host device of one name", field: "spec.domain.devices.hostDevices[0].name", detail: "Duplicate value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "x", DeviceName: "devices.kubevisor.io/gpu"}}
				s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "x", DeviceName: "devices.kubevisor.io/nic"}}
			}},
		{name: "disk without volume", field: "spec.domain.devices.disks[1].name", detail: "Not found",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "data"})
			}},
		{name: "volume without disk", field: "spec.volumes[1].name", detail: "not used by any disk",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = append(s.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
					EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
			}},
		{name: "volume with two sources", field: "spec.volumes[0]", detail: "exactly one volume source",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].EmptyDisk = &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}
			}},
		{name: "empty disk without capacity", field: "spec.volumes[0].emptyDisk.capacity", detail: "greater than 0",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{}}
			}},
		{name: "relative host disk path", field: "spec.volumes[0].hostDisk.path", detail: "absolute path",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "disk.img", Type: v1alpha1.HostDiskExists}}
			}},
		{name: "hotpluggable claim", field: "spec.volumes[0].persistentVolumeClaim.hotpluggable", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				pvc := &v1alpha1.PersistentVolumeClaimVolumeSource{Hotpluggable: true}
				pvc.ClaimName = "data"
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{PersistentVolumeClaim: pvc}
			}},
		{name: "disk and cdrom", field: "spec.domain.devices.disks[0]", detail: "mutually exclusive",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].CDRom = &v1alpha1.CDRomTarget{}
			}},
		{name: "cdrom on virtio", field: "spec.domain.devices.disks[0].cdrom.bus", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusVirtio}}
			}},
		{name: "open cdrom tray", field: "spec.domain.devices.disks[0].cdrom.tray", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: "sata", Tray: v1alpha1.TrayStateOpen}}
			}},
		{name: "lun on a claim", field: "spec.domain.devices.disks[0].lun", detail: "a lun on a persistentVolumeClaim is not supported: the launcher pod mounts claims as file systems, not as block devices (use a hostDisk of type Disk with the device's path)",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				pvc := &v1alpha1.PersistentVolumeClaimVolumeSource{}
				pvc.ClaimName = "san"
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{PersistentVolumeClaim: pvc}
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSCSI, ReadOnly: true}}
			}},
		{name: "lun on an existing hostDisk", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/dev/sdb", Type: v1alpha1.HostDiskExists}}
			s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{}}
		}},
		{name: "disk and lun", field: "spec.domain.devices.disks[0]", detail: "disk, cdrom and lun are mutually exclusive",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].LUN = &v1alpha1.LunTarget{}
			}},
		{name: "lun on sata", field: "spec.domain.devices.disks[0].lun.bus", detail: "a lun on bus sata is not supported: SCSI passthrough needs a SCSI bus (use scsi)",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/dev/sdb", Type: v1alpha1.HostDiskExists}}
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSATA}}
			}},
		{name: "lun on a containerDisk", field: "spec.domain.devices.disks[0].lun", detail: "a lun needs a SCSI block device: only a hostDisk of type Disk can be one, and volume root is a file the node makes",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSCSI}}
			}},
		{name: "lun on an emptyDisk", field: "spec.domain.devices.disks[0].lun", detail: "is a file the node makes",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSCSI}}
			}},
		{name: "lun on a hostDisk it creates", field: "spec.domain.devices.disks[0].lun", detail: "a hostDisk of type DiskOrCreate is a file (use type Disk with the device's path)",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/data/d.img", Type: v1alpha1.HostDiskExistsOrCreate, Capacity: resource.MustParse("1Gi")}}
				s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSCSI}}
			}},
		{name: "unknown disk bus", field: "spec.domain.devices.disks[0].disk.bus", detail: "Unsupported value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[0].Disk.Bus = "ide" }},

		// Boot orders.
		{name: "boot order 0", field: "spec.domain.devices.disks[0].bootOrder", detail: "greater than 0",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[0].BootOrder = ptr.To[uint](0) }},
		{name: "boot order shared by a disk and an interface", field: "spec.domain.devices.interfaces[0].bootOrder", detail: "already used by spec.domain.devices.disks[0]",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].BootOrder = ptr.To[uint](1)
				s.Domain.Devices.Interfaces[0].BootOrder = ptr.To[uint](1)
			}},
		{name: "distinct boot orders", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[0].BootOrder = ptr.To[uint](1)
			s.Domain.Devices.Interfaces[0].BootOrder = ptr.To[uint](2)
		}},

		// Memory and CPU.
		{name: "no memory", field: "spec.domain.resources.requests[memory]", detail: "Required value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Resources.Requests = nil }},
		{name: "memory from guest", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Resources.Requests = nil
			s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}
		}},
		{name: "memory request above limit", field: "spec.domain.resources.requests[memory]", detail: "less than or equal to the memory limit",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
			}},
		{name: "cpu request above limit", field: "spec.domain.resources.requests[cpu]", detail: "less than or equal to the cpu limit",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("2")
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
			}},
		{name: "guest memory above limit", field: "spec.domain.memory.guest", detail: "less than or equal to the memory limit",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}
				s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}
			}},
		{name: "resource other than cpu and memory", field: "spec.domain.resources.requests[nvidia.com/gpu]", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Requests["nvidia.com/gpu"] = resource.MustParse("1")
			}},

		// Huge pages.
		{name: "hugepages 2Mi, requests.memory whole pages", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
		}},
		{name: "hugepages 1Gi, memory.guest whole pages", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("2Gi")), Hugepages: &v1alpha1.Hugepages{PageSize: "1Gi"}}
		}},
		{name: "hugepages with no page size", field: "spec.domain.memory.hugepages.pageSize", detail: "Required value: the huge page size: 2Mi or 1Gi",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{}}
			}},
		{name: "hugepages of a size x86_64 lacks", field: "spec.domain.memory.hugepages.pageSize", detail: `Unsupported value: "4Mi": supported values: "2Mi", "1Gi"`,
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "4Mi"}}
			}},
		{name: "hugepages size written in bytes", field: "spec.domain.memory.hugepages.pageSize", detail: "Unsupported value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2097152"}}
			}},
		{name: "memory.guest not whole huge pages", field: "spec.domain.memory.guest", detail: "must be a multiple of the huge page size 1Gi",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1536Mi")), Hugepages: &v1alpha1.Hugepages{PageSize: "1Gi"}}
			}},
		{name: "requests.memory not whole huge pages", field: "spec.domain.resources.requests[memory]", detail: "must be a multiple of the huge page size 2Mi",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("129Mi")
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
			}},
		{name: "limits.memory not whole huge pages", field: "spec.domain.resources.limits[memory]", detail: "must be a multiple of the huge page size 2Mi",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Requests = nil
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100M")}
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
			}},

		// Dedicated CPUs.
		{name: "dedicated CPUs from the topology", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.CPU.Cores, s.Domain.CPU.DedicatedCPUPlacement, s.Domain.CPU.IsolateEmulatorThread = 2, true, true
		}},
		{name: "dedicated CPUs with requests = limits = vCPUs", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.CPU.Sockets, s.Domain.CPU.DedicatedCPUPlacement = 2, true
			s.Domain.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("2")
			s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2000m"), corev1.ResourceMemory: resource.MustParse("128Mi")}
		}},
		{name: "isolateEmulatorThread without dedicated CPUs", field: "spec.domain.cpu.isolateEmulatorThread", detail: "requires cpu.dedicatedCpuPlacement",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.CPU.IsolateEmulatorThread = true }},
		{name: "dedicated CPUs with a fractional CPU request", field: "spec.domain.resources.requests[cpu]", detail: "must be the vCPU count 1 with cpu.dedicatedCpuPlacement",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.CPU.DedicatedCPUPlacement = true
				s.Domain.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("500m")
			}},
		{name: "dedicated CPUs with a CPU limit above the vCPUs", field: "spec.domain.resources.limits[cpu]", detail: "must be the vCPU count 2",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.CPU.Sockets, s.Domain.CPU.DedicatedCPUPlacement = 2, true
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}
			}},
		{name: "dedicated CPUs with memory requests below limits", field: "spec.domain.resources.requests[memory]", detail: "must equal the memory limit 256Mi",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.CPU.DedicatedCPUPlacement = true
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
			}},
		{name: "NUMA passthrough with dedicated CPUs on huge pages", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.CPU.DedicatedCPUPlacement = true
			s.Domain.CPU.NUMA = &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}
			s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
		}},
		{name: "NUMA passthrough without dedicated CPUs", field: "spec.domain.cpu.numa.guestMappingPassthrough", detail: "requires cpu.dedicatedCpuPlacement",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.CPU.NUMA = &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}
				s.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
			}},
		{name: "NUMA passthrough without huge pages", field: "spec.domain.cpu.numa.guestMappingPassthrough", detail: "requires memory.hugepages",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.CPU.DedicatedCPUPlacement = true
				s.Domain.CPU.NUMA = &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}
			}},
		{name: "memory requests below limits without dedicated CPUs", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
		}},
		{name: "too many vCPUs", field: "spec.domain.cpu", detail: "exceed the maximum",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.CPU.Sockets, s.Domain.CPU.Cores = 64, 64 }},

		// Cloud-init.
		{name: "inline user data within the limit", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: strings.Repeat("x", MaxCloudInitUserDataBytes)})
		}},
		{name: "inline user data too long", field: "spec.volumes[1].cloudInitNoCloud.userData", detail: "more than 2048 bytes",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: big})
			}},
		{name: "base64 user data too long once decoded", field: "spec.volumes[1].cloudInitNoCloud.userDataBase64", detail: "more than 2048 bytes",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserDataBase64: base64.StdEncoding.EncodeToString([]byte(big))})
			}},
		{name: "network data too long", field: "spec.volumes[1].cloudInitNoCloud.networkData", detail: "more than 2048 bytes",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config", NetworkData: big})
			}},
		{name: "user data not base64", field: "spec.volumes[1].cloudInitNoCloud.userDataBase64", detail: "not valid base64",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserDataBase64: "%%%"})
			}},
		{name: "user data inline and in a secret", field: "spec.volumes[1].cloudInitNoCloud", detail: "only one of userData",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "x", UserDataSecretRef: &corev1.LocalObjectReference{Name: "s"}})
			}},
		{name: "cloud-init without data", field: "spec.volumes[1].cloudInitNoCloud", detail: "user data or network data is required",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{}) }},

		// Interfaces and networks.
		{name: "interface without network", field: "spec.domain.devices.interfaces[0].name", detail: "Not found",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Devices.Interfaces[0].Name = "other" }},
		{name: "network without interface", field: "spec.networks[1].name", detail: "not used by any interface",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = append(s.Networks, v1alpha1.Network{Name: "extra", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "net"}}})
			}},
		{name: "network without source", field: "spec.networks[0].pod", detail: "network source",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Networks[0].Pod = nil }},
		{name: "interface without binding", field: "spec.domain.devices.interfaces[0].masquerade", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Devices.Interfaces[0].Masquerade = nil }},
		{name: "masquerade on multus", field: "spec.domain.devices.interfaces[0].masquerade", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks[0].NetworkSource = v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "net"}}
			}},
		{name: "bridge on multus", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Networks[0].NetworkSource = v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "ns/net"}}
			s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
		}},
		{name: "multus as the default network", field: "spec.networks[0].multus.default", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks[0].NetworkSource = v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "net", Default: true}}
				s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
			}},
		{name: "guest network CIDR", field: "spec.networks[0].pod.vmNetworkCIDR", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Networks[0].Pod.VMNetworkCIDR = "10.1.0.0/24" }},
		{name: "the driver's own guest network CIDRs", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Networks[0].Pod.VMNetworkCIDR, s.Networks[0].Pod.VMIPv6NetworkCIDR = "10.0.2.0/24", "fd10:0:2::/120"
		}},
		{name: "ports on bridge", field: "spec.domain.devices.interfaces[0].ports", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
				s.Domain.Devices.Interfaces[0].Ports = []v1alpha1.Port{{Port: 22}}
			}},
		{name: "multicast MAC", field: "spec.domain.devices.interfaces[0].macAddress", detail: "unicast",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Interfaces[0].MacAddress = "01:00:5e:00:00:01"
			}},

		// Firmware.
		{name: "kernel boot with EFI", field: "spec.domain.firmware.kernelBoot", detail: "not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Firmware = &v1alpha1.Firmware{
					Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}},
					KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{Image: "k", KernelPath: "/vmlinuz"}},
				}
			}},
		{name: "kernel boot without container", field: "spec.domain.firmware.kernelBoot.container", detail: "Required value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{}}
			}},

		// Scheduling and the class.
		{name: "negative grace period", field: "spec.terminationGracePeriodSeconds", detail: "must not be negative",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.TerminationGracePeriodSeconds = ptr.To[int64](-1) }},
		{name: "bad hypervisor class name", field: "spec.hypervisorClassName", detail: "RFC 1123",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.HypervisorClassName = "Not A Name" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSpec()
			tt.change(s)
			errs := Validate(s, field.NewPath("spec"))
			if tt.field == "" {
				if len(errs) > 0 {
					t.Fatalf("rejected a valid spec: %v", errs.ToAggregate())
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.field && strings.Contains(e.Error(), tt.detail) {
					return
				}
			}
			t.Fatalf("want an error at %s saying %q, got %v", tt.field, tt.detail, errs.ToAggregate())
		})
	}
}

// TestValidateTemplatePath checks that a VM's errors sit under spec.template.spec.
func TestValidateTemplatePath(t *testing.T) {
	s := validSpec()
	s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "data"})
	vm := &v1alpha1.VirtualMachineSpec{Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: *s}}
	errs := ValidateVirtualMachineSpec(vm, field.NewPath("spec"))
	if len(errs) != 1 || errs[0].Field != "spec.template.spec.domain.devices.disks[1].name" {
		t.Fatalf("got %v", errs)
	}
}

func TestValidateVirtualMachineSpec(t *testing.T) {
	always := v1alpha1.RunStrategyAlways
	bogus := v1alpha1.VirtualMachineRunStrategy("Sometimes")
	tests := []struct {
		name   string
		spec   v1alpha1.VirtualMachineSpec
		field  string
		detail string
	}{
		{name: "runStrategy", spec: v1alpha1.VirtualMachineSpec{RunStrategy: &always}},
		{name: "running", spec: v1alpha1.VirtualMachineSpec{Running: ptr.To(true)}},
		{name: "running and runStrategy", spec: v1alpha1.VirtualMachineSpec{Running: ptr.To(true), RunStrategy: &always},
			field: "spec.running", detail: "mutually exclusive"},
		{name: "unknown run strategy", spec: v1alpha1.VirtualMachineSpec{RunStrategy: &bogus},
			field: "spec.runStrategy", detail: "Unsupported value"},
		{name: "no template", spec: v1alpha1.VirtualMachineSpec{RunStrategy: &always}, field: "spec.template", detail: "Required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "no template" {
				tt.spec.Template = &v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: *validSpec()}
			}
			assertErrs(t, ValidateVirtualMachineSpec(&tt.spec, field.NewPath("spec")), tt.field, tt.detail)
		})
	}
}

func TestValidateReplicaSetSpec(t *testing.T) {
	tmpl := func() *v1alpha1.VirtualMachineInstanceTemplateSpec {
		return &v1alpha1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
			Spec:       *validSpec(),
		}
	}
	tests := []struct {
		name   string
		spec   v1alpha1.VirtualMachineInstanceReplicaSetSpec
		field  string
		detail string
	}{
		{name: "matching selector", spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: tmpl()}},
		{name: "selector does not match", field: "spec.selector", detail: "does not match", spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, Template: tmpl()}},
		{name: "empty selector", field: "spec.selector", detail: "must not be empty", spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Selector: &metav1.LabelSelector{}, Template: tmpl()}},
		{name: "negative replicas", field: "spec.replicas", detail: "must not be negative", spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Replicas: ptr.To[int32](-1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: tmpl()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertErrs(t, ValidateReplicaSetSpec(&tt.spec, field.NewPath("spec")), tt.field, tt.detail)
		})
	}
}

func TestValidateUpdates(t *testing.T) {
	old := validSpec()
	same := validSpec()
	assertErrs(t, ValidateVMISpecUpdate(same, old, field.NewPath("spec")), "", "")
	changed := validSpec()
	changed.Domain.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("256Mi")
	assertErrs(t, ValidateVMISpecUpdate(changed, old, field.NewPath("spec")), "spec", "immutable")
	shorter := validSpec()
	shorter.TerminationGracePeriodSeconds = ptr.To[int64](0)
	assertErrs(t, ValidateVMISpecUpdate(shorter, old, field.NewPath("spec")), "", "")
	negative := validSpec()
	negative.TerminationGracePeriodSeconds = ptr.To[int64](-1)
	assertErrs(t, ValidateVMISpecUpdate(negative, old, field.NewPath("spec")), "spec.terminationGracePeriodSeconds", "0 or more")
	both := shorter.DeepCopy()
	both.Domain.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("256Mi")
	assertErrs(t, ValidateVMISpecUpdate(both, old, field.NewPath("spec")), "spec", "immutable")

	m := &v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "a"}
	assertErrs(t, ValidateMigrationSpecUpdate(&v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "a"}, m, field.NewPath("spec")), "", "")
	assertErrs(t, ValidateMigrationSpecUpdate(&v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "b"}, m, field.NewPath("spec")), "spec", "immutable")
	assertErrs(t, ValidateMigrationSpec(&v1alpha1.VirtualMachineInstanceMigrationSpec{}, field.NewPath("spec")), "spec.vmiName", "Required")
}

func assertErrs(t *testing.T, errs field.ErrorList, wantField, detail string) {
	t.Helper()
	if wantField == "" {
		if len(errs) > 0 {
			t.Fatalf("rejected: %v", errs.ToAggregate())
		}
		return
	}
	for _, e := range errs {
		if e.Field == wantField && strings.Contains(e.Error(), detail) {
			return
		}
	}
	t.Fatalf("want an error at %s saying %q, got %v", wantField, detail, errs.ToAggregate())
}

// TestValidateDHCPOptions has one row per rule of an interface's dhcpOptions: the options of
// interface 0 of a valid spec (masquerade on the pod network), and the field path and words of
// the rejection (empty field: accepted).
func TestValidateDHCPOptions(t *testing.T) {
	const p = "spec.domain.devices.interfaces[0].dhcpOptions"
	long := strings.Repeat("x", 256)
	tests := []struct {
		name   string
		opts   v1alpha1.DHCPOptions
		field  string
		detail string
	}{
		{name: "every option", opts: v1alpha1.DHCPOptions{
			BootFileName: "pxelinux.0", TFTPServerName: "tftp.example.org", NTPServers: []string{"192.0.2.1", "192.0.2.2"},
			PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 224, Value: "first"}, {Option: 254, Value: "last"}, {Option: 240, Value: ""}},
		}},
		{name: "values of 255 bytes", opts: v1alpha1.DHCPOptions{
			BootFileName: long[:255], TFTPServerName: long[:255], PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 230, Value: long[:255]}},
		}},
		{name: "none", opts: v1alpha1.DHCPOptions{}},
		{name: "private option below 224", field: p + ".privateOptions[1].option", detail: "must be between 224 and 254",
			opts: v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 224}, {Option: 223}}}},
		{name: "private option above 254", field: p + ".privateOptions[0].option", detail: "must be between 224 and 254",
			opts: v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 255, Value: "end"}}}},
		{name: "a standard option as a private one", field: p + ".privateOptions[0].option", detail: "Invalid value: 67",
			opts: v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 67, Value: "boot.ipxe"}}}},
		{name: "private option twice", field: p + ".privateOptions[2].option", detail: "Duplicate value: 225",
			opts: v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 225}, {Option: 226}, {Option: 225}}}},
		{name: "NTP server not an address", field: p + ".ntpServers[1]", detail: "must be an IPv4 address",
			opts: v1alpha1.DHCPOptions{NTPServers: []string{"192.0.2.1", "pool.ntp.org"}}},
		{name: "NTP server IPv6", field: p + ".ntpServers[0]", detail: `Invalid value: "2001:db8::1": must be an IPv4 address`,
			opts: v1alpha1.DHCPOptions{NTPServers: []string{"2001:db8::1"}}},
		{name: "NTP server with a prefix length", field: p + ".ntpServers[0]", detail: "must be an IPv4 address",
			opts: v1alpha1.DHCPOptions{NTPServers: []string{"192.0.2.0/24"}}},
		{name: "64 NTP servers", field: p + ".ntpServers", detail: "must have at most 63 items",
			opts: v1alpha1.DHCPOptions{NTPServers: slices.Repeat([]string{"192.0.2.1"}, 64)}},
		{name: "boot file name too long", field: p + ".bootFileName", detail: "Too long",
			opts: v1alpha1.DHCPOptions{BootFileName: long}},
		{name: "TFTP server name too long", field: p + ".tftpServerName", detail: "Too long",
			opts: v1alpha1.DHCPOptions{TFTPServerName: long}},
		{name: "private value too long", field: p + ".privateOptions[0].value", detail: "Too long",
			opts: v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 250, Value: long}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSpec()
			opts := tt.opts
			s.Domain.Devices.Interfaces[0].DHCPOptions = &opts
			assertErrs(t, Validate(s, field.NewPath("spec")), tt.field, tt.detail)
		})
	}
	// The bridge binding's guest gets them too.
	s := validSpec()
	s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
	s.Domain.Devices.Interfaces[0].DHCPOptions = &v1alpha1.DHCPOptions{BootFileName: "boot.ipxe"}
	assertErrs(t, Validate(s, field.NewPath("spec")), "", "")
}

// TestValidateProbes has one row per rule of livenessProbe and readinessProbe: the change to a
// valid spec (masquerade on the pod network, every port forwarded) and the field path and words
// of the rejection (empty field: accepted).
func TestValidateProbes(t *testing.T) {
	httpGet := func(port intstr.IntOrString) *v1alpha1.Probe {
		return &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: port}}, PeriodSeconds: 2}
	}
	tcp := func(port int) *v1alpha1.Probe {
		return &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}}
	}
	tests := []struct {
		name   string
		change func(s *v1alpha1.VirtualMachineInstanceSpec)
		field  string
		detail string
	}{
		{name: "httpGet readiness and tcp liveness on masquerade", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe, s.LivenessProbe = httpGet(intstr.FromInt(80)), tcp(22)
		}},
		{name: "https with headers", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe = httpGet(intstr.FromInt(443))
			s.ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTPS
			s.ReadinessProbe.HTTPGet.HTTPHeaders = []corev1.HTTPHeader{{Name: "X-Probe", Value: "1"}}
		}},
		{name: "no handler", field: "spec.readinessProbe", detail: "exactly one of httpGet, tcpSocket, exec and guestAgentPing is required",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.ReadinessProbe = &v1alpha1.Probe{PeriodSeconds: 2} }},
		{name: "two handlers", field: "spec.livenessProbe", detail: "exactly one of httpGet, tcpSocket, exec and guestAgentPing may be set",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.LivenessProbe = tcp(22)
				s.LivenessProbe.HTTPGet = &corev1.HTTPGetAction{Port: intstr.FromInt(80)}
			}},
		{name: "exec and guestAgentPing", field: "spec.readinessProbe", detail: `"exec, guestAgentPing": exactly one of`,
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{
					Exec: &corev1.ExecAction{Command: []string{"true"}}, GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
			}},
		{name: "exec and guestAgentPing without a pod network", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			// Through the guest agent: no interface is needed.
			s.Networks = []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "lan"}}}}
			s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
			s.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}}, PeriodSeconds: 5}
			s.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}, SuccessThreshold: 2}
		}},
		{name: "exec without a command", field: "spec.livenessProbe.exec.command", detail: "Required value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{}}}
			}},
		{name: "exec with an empty program", field: "spec.readinessProbe.exec.command", detail: "Required value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"", "x"}}}}
			}},
		{name: "guestAgentPing with a liveness success threshold above 1", field: "spec.livenessProbe.successThreshold", detail: "must be 1",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}, SuccessThreshold: 3}
			}},
		{name: "named port", field: "spec.readinessProbe.httpGet.port", detail: "a named port is not supported",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.ReadinessProbe = httpGet(intstr.FromString("http")) }},
		{name: "port out of range", field: "spec.livenessProbe.tcpSocket.port", detail: "between 1 and 65535",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.LivenessProbe = tcp(0) }},
		{name: "a host of its own", field: "spec.livenessProbe.tcpSocket.host", detail: "the launcher pod's address",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.LivenessProbe = tcp(22)
				s.LivenessProbe.TCPSocket.Host = "192.0.2.1"
			}},
		{name: "unknown scheme", field: "spec.readinessProbe.httpGet.scheme", detail: "Unsupported value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.ReadinessProbe = httpGet(intstr.FromInt(80))
				s.ReadinessProbe.HTTPGet.Scheme = "FTP"
			}},
		{name: "liveness success threshold above 1", field: "spec.livenessProbe.successThreshold", detail: "must be 1 for a liveness probe",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.LivenessProbe = tcp(22)
				s.LivenessProbe.SuccessThreshold = 2
			}},
		{name: "readiness success threshold above 1", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe = tcp(22)
			s.ReadinessProbe.SuccessThreshold = 2
		}},
		{name: "masquerade forwarding the probed port", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Ports = []v1alpha1.Port{{Port: 22}, {Port: 80, Protocol: "TCP"}}
			s.ReadinessProbe = httpGet(intstr.FromInt(80))
		}},
		{name: "masquerade not forwarding the probed port", field: "spec.readinessProbe.httpGet.port",
			detail: "spec.domain.devices.interfaces[0].ports does not forward TCP port 80",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Interfaces[0].Ports = []v1alpha1.Port{{Port: 22}, {Port: 80, Protocol: "UDP"}}
				s.ReadinessProbe = httpGet(intstr.FromInt(80))
			}},
		{name: "bridge on the pod network", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
			s.LivenessProbe = tcp(22)
		}},
		{name: "no pod network", field: "spec.livenessProbe.tcpSocket.port", detail: "needs an interface on the pod network",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "lan"}}}}
				s.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
				s.LivenessProbe = tcp(22)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSpec()
			tt.change(s)
			errs := Validate(s, field.NewPath("spec"))
			if tt.field == "" {
				if len(errs) != 0 {
					t.Fatalf("want accepted, got %v", errs)
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.field && strings.Contains(e.Error(), tt.detail) {
					return
				}
			}
			t.Fatalf("want an error at %s containing %q, got %v", tt.field, tt.detail, errs)
		})
	}
}
