/*
Copyright 2026 The Kubevisor Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// DomainSpec describes the virtual hardware of a VirtualMachineInstance (KubeVirt's DomainSpec subset).
type DomainSpec struct {
	// Resources describes the compute resources required by this VMI.
	// +optional
	Resources ResourceRequirements `json:"resources,omitempty"`
	// CPU specifies the CPU topology and model inside the VMI.
	// +optional
	CPU *CPU `json:"cpu,omitempty"`
	// Memory specifies the memory visible inside the VMI.
	// +optional
	Memory *Memory `json:"memory,omitempty"`
	// Machine selects the machine type (chipset) of the VMI.
	// +optional
	Machine *Machine `json:"machine,omitempty"`
	// Firmware selects the firmware, bootloader and SMBIOS identity of the VMI.
	// +optional
	Firmware *Firmware `json:"firmware,omitempty"`
	// Chassis is the SMBIOS chassis information (type 3) the guest reads (dmidecode, /sys/class/dmi).
	// The hypervisor driver must offer the "chassis" device (its capabilities).
	// +optional
	Chassis *Chassis `json:"chassis,omitempty"`
	// Features turns platform features on or off: ACPI, APIC, SMM, Hyper-V enlightenments, KVM
	// visibility, paravirtual spinlocks. Those that only exist under hardware virtualisation
	// (Hyper-V, kvm.hidden, pvspinlock, apic.endOfInterrupt) schedule the VMI onto nodes whose
	// hypervisor driver runs with KVM. The hypervisor driver must offer "features".
	// +optional
	Features *Features `json:"features,omitempty"`
	// Clock sets the guest's real-time clock (UTC, an offset from it, or a time zone) and its
	// timers. The hypervisor driver must offer "clock".
	// +optional
	Clock *Clock `json:"clock,omitempty"`
	// IOThreadsPolicy gives the virtio disks I/O threads: shared (one for all), auto (a pool of
	// at most two per vCPU, the disks spread over it) or supplementalPool (a pool of
	// ioThreads.supplementalPoolThreadCount). A disk with dedicatedIOThread has its own
	// whatever the policy. Unset: no I/O threads.
	// +kubebuilder:validation:Enum=shared;auto;supplementalPool
	// +optional
	IOThreadsPolicy *IOThreadsPolicy `json:"ioThreadsPolicy,omitempty"`
	// IOThreads sizes the supplementalPool policy's pool.
	// +optional
	IOThreads *DiskIOThreads `json:"ioThreads,omitempty"`
	// LaunchSecurity runs the guest with its memory encrypted by the host CPU (AMD SEV), which
	// the host cannot read. Such a VMI is placed only onto nodes whose hypervisor driver runs
	// with KVM and that offer /dev/sev (the devices.kubevisor.io/sev resource); it needs EFI
	// firmware without secure boot, and every virtio device reaches its memory through the
	// platform IOMMU. The hypervisor driver must offer "launch-security".
	// +optional
	LaunchSecurity *LaunchSecurity `json:"launchSecurity,omitempty"`
	// Devices lists the disks, network interfaces and other devices of the VMI.
	Devices Devices `json:"devices"`
}

// LaunchSecurity selects the memory encryption technology of a VMI.
type LaunchSecurity struct {
	// SEV is AMD Secure Encrypted Virtualization.
	// +optional
	SEV *SEV `json:"sev,omitempty"`
}

// SEV configures an AMD SEV guest. Debugging the guest is never allowed (the policy's NoDebug
// bit is always set), as with KubeVirt.
type SEV struct {
	// Policy is the guest policy of the AMD SEV API.
	// +optional
	Policy *SEVPolicy `json:"policy,omitempty"`
}

// SEVPolicy holds the guest policy flags a VMI may choose.
type SEVPolicy struct {
	// EncryptedState requires SEV-ES: the vCPUs' register state is encrypted too. Default false.
	// +optional
	EncryptedState *bool `json:"encryptedState,omitempty"`
}

// Chassis is the SMBIOS chassis information of a VMI. Fields left empty are left to the
// hypervisor's defaults.
type Chassis struct {
	// Manufacturer is the chassis manufacturer (chassis_vendor).
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Manufacturer string `json:"manufacturer,omitempty"`
	// Version is the chassis version.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Version string `json:"version,omitempty"`
	// Serial is the chassis serial number.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Serial string `json:"serial,omitempty"`
	// Asset is the chassis asset tag.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Asset string `json:"asset,omitempty"`
	// Sku is the chassis SKU number.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Sku string `json:"sku,omitempty"`
}

// ResourceRequirements describes the compute resources of a VMI.
type ResourceRequirements struct {
	// Requests is a description of the initial VMI resources.
	// Valid resource keys are "memory" and "cpu".
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
	// Limits describes the maximum amount of compute resources allowed.
	// Valid resource keys are "memory" and "cpu".
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
}

// CPU specifies the CPU topology and model of a VMI.
type CPU struct {
	// Cores specifies the number of cores inside the VMI.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Cores uint32 `json:"cores,omitempty"`
	// Sockets specifies the number of sockets inside the VMI.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Sockets uint32 `json:"sockets,omitempty"`
	// Threads specifies the number of threads inside the VMI.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Threads uint32 `json:"threads,omitempty"`
	// Model specifies the CPU model inside the VMI, for example "host-passthrough" or "host-model".
	// The hypervisor driver decides which models it supports.
	// +optional
	Model string `json:"model,omitempty"`
	// Features turns CPU features (CPUID flags, by the hypervisor's names: "aes", "avx2",
	// "pcid") on or off on top of the model. The hypervisor driver must offer "cpu-features".
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Features []CPUFeature `json:"features,omitempty"`
	// DedicatedCPUPlacement gives each vCPU a host CPU of its own: the launcher pod is in the
	// Guaranteed QoS class with a whole number of CPUs (the vCPUs, plus one with
	// isolateEmulatorThread), so that the kubelet's static CPU manager gives its compute
	// container exclusive CPUs, and it is placed only on nodes labelled
	// kubevisor.io/cpumanager=true; each vCPU's thread is then pinned to one of those CPUs.
	// CPU requests and limits, when set, must equal the vCPU count. The hypervisor driver must
	// offer "cpu-pinning".
	// +optional
	DedicatedCPUPlacement bool `json:"dedicatedCpuPlacement,omitempty"`
	// IsolateEmulatorThread, with dedicatedCpuPlacement, asks for one more exclusive CPU and
	// pins the hypervisor's other threads (its main loop, I/O) there, away from the vCPUs.
	// Without it they share the vCPUs' CPUs.
	// +optional
	IsolateEmulatorThread bool `json:"isolateEmulatorThread,omitempty"`
	// NUMA gives the guest a NUMA topology.
	// +optional
	NUMA *NUMA `json:"numa,omitempty"`
}

// NUMA is the guest's NUMA topology.
type NUMA struct {
	// GuestMappingPassthrough mirrors the host's: a guest NUMA node per host NUMA node that
	// holds dedicated CPUs of the VMI, with the vCPUs pinned there and an equal share of the
	// guest memory (whole huge pages) bound to that host node's memory. It requires
	// dedicatedCpuPlacement and memory.hugepages. The hypervisor driver must offer "numa".
	// +optional
	GuestMappingPassthrough *NUMAGuestMappingPassthrough `json:"guestMappingPassthrough,omitempty"`
}

// NUMAGuestMappingPassthrough asks for the guest NUMA topology of NUMA.GuestMappingPassthrough;
// it has no settings.
type NUMAGuestMappingPassthrough struct{}

// CPUFeature is one CPU feature and what to do with it.
type CPUFeature struct {
	// Name is the feature's name.
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9_.-]*$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Policy is require (the default: on, and the VM does not start where the CPU lacks it),
	// force or optional (on where the CPU has it), disable or forbid (off).
	// +kubebuilder:validation:Enum=force;require;optional;disable;forbid
	// +optional
	Policy string `json:"policy,omitempty"`
}

// Memory specifies the memory of a VMI.
type Memory struct {
	// Guest is the amount of memory visible inside the guest OS.
	// Defaults to the requested memory of the resources section.
	// +optional
	Guest *resource.Quantity `json:"guest,omitempty"`
	// Hugepages backs the guest memory with huge pages of pageSize instead of regular memory.
	// The launcher pod then requests the guest memory as the hugepages-<pageSize> resource
	// (requests = limits), so it is scheduled only onto nodes that have such pages free, and
	// its memory request keeps only the overhead. The guest memory must be a multiple of the
	// page size. The hypervisor driver must offer "hugepages".
	// +optional
	Hugepages *Hugepages `json:"hugepages,omitempty"`
}

// Hugepages is the huge page size that backs a VMI's guest memory.
type Hugepages struct {
	// PageSize is the size of the huge pages: 2Mi or 1Gi (x86_64's).
	PageSize string `json:"pageSize,omitempty"`
}

// Machine selects the machine type of a VMI.
type Machine struct {
	// Type is the machine type (chipset) of the VMI, for example "q35". Empty lets the driver choose.
	// +optional
	Type string `json:"type"`
}

// Firmware selects the firmware of a VMI.
type Firmware struct {
	// UUID reported by the VMI's firmware. Defaults to a random UUID.
	// +optional
	UUID types.UID `json:"uuid,omitempty"`
	// Bootloader selects BIOS or EFI.
	// +optional
	Bootloader *Bootloader `json:"bootloader,omitempty"`
	// Serial is the system serial number in SMBIOS.
	// +optional
	Serial string `json:"serial,omitempty"`
	// KernelBoot boots the VMI from a kernel and initrd instead of a disk.
	// +optional
	KernelBoot *KernelBoot `json:"kernelBoot,omitempty"`
}

// Bootloader selects the bootloader of a VMI. At most one of its members may be set; BIOS is the default.
// +kubebuilder:validation:XValidation:rule="!(has(self.bios) && has(self.efi))",message="bios and efi are mutually exclusive"
type Bootloader struct {
	// BIOS selects BIOS firmware (the default).
	// +optional
	BIOS *BIOS `json:"bios,omitempty"`
	// EFI selects EFI firmware.
	// +optional
	EFI *EFI `json:"efi,omitempty"`
}

// BIOS selects BIOS firmware.
type BIOS struct {
	// UseSerial sends the BIOS's own output (its banner, boot menu and messages) to the serial
	// console as well. The hypervisor driver must offer "bios-serial".
	// +optional
	UseSerial *bool `json:"useSerial,omitempty"`
}

// EFI selects EFI firmware.
type EFI struct {
	// SecureBoot enables Secure Boot. Defaults to true.
	// +optional
	SecureBoot *bool `json:"secureBoot,omitempty"`
	// Persistent keeps the EFI variable store (boot entries, Secure Boot keys the guest
	// enrolled) across the VM's restarts, on the VM's persistent state claim (as KubeVirt's
	// backend storage). Without it the store lasts as long as the VMI.
	// +optional
	Persistent *bool `json:"persistent,omitempty"`
}

// KernelBoot boots a VMI from a kernel and initrd.
type KernelBoot struct {
	// KernelArgs are passed to the kernel at boot time.
	// +optional
	KernelArgs string `json:"kernelArgs,omitempty"`
	// Container is the image that holds the kernel and initrd.
	// +optional
	Container *KernelBootContainer `json:"container,omitempty"`
}

// KernelBootContainer is an image that holds a kernel and an initrd.
type KernelBootContainer struct {
	// Image that contains the initrd and kernel files.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// ImagePullPolicy is one of Always, Never, IfNotPresent.
	// +kubebuilder:validation:Enum=Always;Never;IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// KernelPath is the fully-qualified path of the kernel image in the container.
	// +optional
	KernelPath string `json:"kernelPath,omitempty"`
	// InitrdPath is the fully-qualified path of the ramdisk image in the container.
	// +optional
	InitrdPath string `json:"initrdPath,omitempty"`
}

// Devices lists the devices of a VMI.
type Devices struct {
	// Disks are the disks and cdroms connected to the VMI. Each names a volume.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Disks []Disk `json:"disks,omitempty"`
	// Interfaces are the network interfaces of the VMI. Each names a network.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Interfaces []Interface `json:"interfaces,omitempty"`
	// AutoattachPodInterface adds an interface on the pod network (masquerade, named default)
	// when the VMI lists no interfaces and no networks. Defaults to true; false leaves such a
	// VMI without a network interface.
	// +optional
	AutoattachPodInterface *bool `json:"autoattachPodInterface,omitempty"`
	// AutoattachGraphicsDevice attaches the default graphics device. Defaults to true.
	// +optional
	AutoattachGraphicsDevice *bool `json:"autoattachGraphicsDevice,omitempty"`
	// AutoattachSerialConsole attaches the default serial console. Defaults to true.
	// +optional
	AutoattachSerialConsole *bool `json:"autoattachSerialConsole,omitempty"`
	// LogSerialConsole logs the default serial console to the launcher pod's guest-console-log
	// container (kubectl logs POD -c guest-console-log). Defaults to true. False, or no serial
	// console (autoattachSerialConsole false), leaves that container out of the pod: one
	// container less to start per VMI.
	// +optional
	LogSerialConsole *bool `json:"logSerialConsole,omitempty"`
	// Rng attaches a virtio entropy device (virtio-rng) fed from the host's /dev/urandom, so
	// that the guest's kernel does not wait for entropy. The hypervisor driver must offer the
	// "rng" device (its capabilities); a VMI that asks for it elsewhere is refused.
	// +optional
	Rng *Rng `json:"rng,omitempty"`
	// AutoattachMemBalloon attaches a virtio memory balloon, through which the guest reports
	// its memory use. Defaults to true. The hypervisor driver must offer "balloon" for it.
	// +optional
	AutoattachMemBalloon *bool `json:"autoattachMemBalloon,omitempty"`
	// AutoattachInputDevice adds a USB tablet (named default-0) when inputs lists none, so that a
	// graphical console's pointer follows the host's. Defaults to false.
	// +optional
	AutoattachInputDevice *bool `json:"autoattachInputDevice,omitempty"`
	// Inputs are the VMI's input devices: tablets and keyboards on the usb or virtio bus. The
	// hypervisor driver must offer "input".
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Inputs []Input `json:"inputs,omitempty"`
	// Watchdog is a hardware watchdog the guest must keep feeding; when it stops, the action is
	// taken. The hypervisor driver must offer "watchdog".
	// +optional
	Watchdog *Watchdog `json:"watchdog,omitempty"`
	// Sound is an emulated sound card (its output goes nowhere: the node has no audio). The
	// hypervisor driver must offer "sound".
	// +optional
	Sound *SoundDevice `json:"sound,omitempty"`
	// TPM is an emulated TPM 2.0 (swtpm) whose state lasts as long as the VMI: a restart of
	// the guest keeps it, a new VMI starts with a fresh TPM. The hypervisor driver must offer
	// "tpm".
	// +optional
	TPM *TPMDevice `json:"tpm,omitempty"`
	// GPUs are host GPUs passed through to the guest, each one device of the extended resource
	// DeviceName (a device driver advertises it through the kubelet device plugins; which host
	// devices become which resource is the device driver's configuration, KubeVirt's
	// permittedHostDevices). The launcher pod requests one DeviceName per entry.
	// +optional
	// +listType=atomic
	GPUs []GPU `json:"gpus,omitempty"`
	// HostDevices are host devices (VFIO PCI functions) passed through to the guest, as GPUs.
	// +optional
	// +listType=atomic
	HostDevices []HostDevice `json:"hostDevices,omitempty"`
	// DisableHotplug says the VMI takes no disk hotplug. Kubevisor hotplugs no disk into any
	// VMI, so every VMI is as with true; the field is there for KubeVirt's manifests.
	// +optional
	DisableHotplug bool `json:"disableHotplug,omitempty"`
	// BlockMultiQueue gives each virtio disk as many queues as the VMI has vCPUs.
	// +optional
	BlockMultiQueue *bool `json:"blockMultiQueue,omitempty"`
	// NetworkInterfaceMultiQueue gives each virtio interface as many queue pairs as the VMI has
	// vCPUs (sockets*cores*threads), at most 256 (the most a Linux tap has), so that the guest
	// spreads its network traffic over its vCPUs. As in KubeVirt it applies to the virtio model
	// only: an interface of another model (e1000, e1000e, rtl8139) keeps its one queue. With
	// one vCPU nothing changes. With more, the hypervisor driver must offer "nic-multiqueue"
	// and the network driver must make multi-queue taps; a VMI whose drivers do not is refused.
	// +optional
	NetworkInterfaceMultiQueue *bool `json:"networkInterfaceMultiqueue,omitempty"`
	// UseVirtioTransitional makes the VMI's virtio devices (disks, interfaces, the entropy
	// device, the memory balloon, the virtio-scsi controller) transitional: they offer the
	// legacy (virtio 0.9) interface besides the modern (virtio 1.0) one, for guests too old for
	// virtio 1.0 (Linux before 4.0, RHEL 6). Unset or false, as in KubeVirt, they are modern
	// only (PCI device IDs 1af4:1040 and up). Virtio input devices are modern only either way.
	// The hypervisor driver must offer "virtio-transitional" for true.
	// +optional
	UseVirtioTransitional *bool `json:"useVirtioTransitional,omitempty"`
}

// GPU is a host GPU passed through to the guest.
type GPU struct {
	// Name is the device's name in the VMI.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// DeviceName is the extended resource the GPU is allocated from ("nvidia.com/GA102",
	// "devices.kubevisor.io/gpu").
	// +kubebuilder:validation:MinLength=1
	DeviceName string `json:"deviceName"`
}

// HostDevice is a host device passed through to the guest.
type HostDevice struct {
	// Name is the device's name in the VMI.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// DeviceName is the extended resource the device is allocated from.
	// +kubebuilder:validation:MinLength=1
	DeviceName string `json:"deviceName"`
}

// TPMDevice is a TPM 2.0 device.
type TPMDevice struct {
	// Enabled gives the guest the TPM; false means no TPM, as if the field were absent.
	// Defaults to true.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Persistent keeps the TPM's state (its seeds, NV indices and counters) across the VM's
	// restarts, on the VM's persistent state claim (as KubeVirt's backend storage). Without it
	// the state lasts as long as the VMI (a guest reboot keeps it).
	// +optional
	Persistent *bool `json:"persistent,omitempty"`
}

// IsEnabled says whether t gives the guest a TPM: t is set and its Enabled is not false.
func (t *TPMDevice) IsEnabled() bool { return t != nil && (t.Enabled == nil || *t.Enabled) }

// SoundDevice is a sound card.
type SoundDevice struct {
	// Name is the device name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Model is ich9 (Intel HD Audio, the default) or ac97.
	// +kubebuilder:validation:Enum=ich9;ac97
	// +optional
	Model string `json:"model,omitempty"`
}

// InputType is the kind of an input device.
// +kubebuilder:validation:Enum=tablet;keyboard
type InputType string

// Input device types.
const (
	InputTypeTablet   InputType = "tablet"
	InputTypeKeyboard InputType = "keyboard"
)

// InputBus is the bus an input device is on.
// +kubebuilder:validation:Enum=usb;virtio
type InputBus string

// Input device buses.
const (
	InputBusUSB    InputBus = "usb"
	InputBusVirtio InputBus = "virtio"
)

// Input is an input device.
type Input struct {
	// Name is the device name, unique among the inputs.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Type is tablet or keyboard.
	Type InputType `json:"type"`
	// Bus is usb (the default) or virtio.
	// +optional
	Bus InputBus `json:"bus,omitempty"`
}

// WatchdogAction is what happens when a watchdog expires.
// +kubebuilder:validation:Enum=poweroff;reset;shutdown
type WatchdogAction string

// Watchdog actions.
const (
	// WatchdogActionPoweroff stops the VM at once, as pulling its power would.
	WatchdogActionPoweroff WatchdogAction = "poweroff"
	// WatchdogActionReset resets the VM.
	WatchdogActionReset WatchdogAction = "reset"
	// WatchdogActionShutdown presses the ACPI power button: the guest shuts down if it can.
	WatchdogActionShutdown WatchdogAction = "shutdown"
)

// Watchdog is a hardware watchdog device.
type Watchdog struct {
	// Name is the device name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// I6300ESB is Intel's 6300ESB watchdog, the only model (and the default when none is set).
	// +optional
	I6300ESB *I6300ESBWatchdog `json:"i6300esb,omitempty"`
}

// I6300ESBWatchdog is the i6300esb watchdog.
type I6300ESBWatchdog struct {
	// Action is poweroff, reset (the default) or shutdown.
	// +optional
	Action WatchdogAction `json:"action,omitempty"`
}

// FeatureState turns a feature on or off.
type FeatureState struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// Features are the platform features of a VMI; an unset one is the machine type's default.
type Features struct {
	// ACPI gives the guest ACPI tables (power button, CPU and device enumeration). Defaults to
	// enabled; disabled, the guest cannot be shut down gracefully.
	// +optional
	ACPI FeatureState `json:"acpi,omitempty"`
	// APIC is the local APIC, always present on x86_64 (it cannot be disabled);
	// endOfInterrupt turns on paravirtual end of interrupt (KVM only).
	// +optional
	APIC *FeatureAPIC `json:"apic,omitempty"`
	// SMM turns System Management Mode on or off (UEFI Secure Boot needs it on).
	// +optional
	SMM *FeatureState `json:"smm,omitempty"`
	// Hyperv turns on Hyper-V enlightenments, for Windows guests (KVM only).
	// +optional
	Hyperv *FeatureHyperv `json:"hyperv,omitempty"`
	// KVM says how KVM shows itself to the guest (KVM only).
	// +optional
	KVM *FeatureKVM `json:"kvm,omitempty"`
	// Pvspinlock tells the guest that the host supports paravirtual spinlocks (KVM only).
	// +optional
	Pvspinlock *FeatureState `json:"pvspinlock,omitempty"`
}

// FeatureAPIC is the local APIC.
type FeatureAPIC struct {
	// Enabled must be true (or unset): an x86_64 guest always has a local APIC.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// EndOfInterrupt turns on paravirtual end of interrupt notification (KVM only).
	// +optional
	EndOfInterrupt bool `json:"endOfInterrupt,omitempty"`
}

// FeatureKVM is how KVM shows itself.
type FeatureKVM struct {
	// Hidden hides KVM's signature from the guest's CPUID.
	// +optional
	Hidden bool `json:"hidden,omitempty"`
}

// FeatureSpinlocks is the Hyper-V spinlock enlightenment.
type FeatureSpinlocks struct {
	// Enabled turns it on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Retries is the number of spinlock retries before the guest notifies the hypervisor.
	// Defaults to 4096.
	// +kubebuilder:validation:Minimum=4096
	// +optional
	Retries *uint32 `json:"spinlocks,omitempty"`
}

// FeatureVendorID is the Hyper-V vendor ID the guest reads.
type FeatureVendorID struct {
	// Enabled turns it on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// VendorID is up to 12 characters.
	// +kubebuilder:validation:MaxLength=12
	// +optional
	VendorID string `json:"vendorid,omitempty"`
}

// SyNICTimer is the Hyper-V synthetic timer enlightenment.
type SyNICTimer struct {
	// Enabled turns it on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Direct turns on direct mode (timer interrupts without the SynIC message path).
	// +optional
	Direct *FeatureState `json:"direct,omitempty"`
}

// FeatureHyperv are the Hyper-V enlightenments; each listed one is on unless it says
// enabled: false.
type FeatureHyperv struct {
	// +optional
	Relaxed *FeatureState `json:"relaxed,omitempty"`
	// +optional
	VAPIC *FeatureState `json:"vapic,omitempty"`
	// +optional
	Spinlocks *FeatureSpinlocks `json:"spinlocks,omitempty"`
	// +optional
	VPIndex *FeatureState `json:"vpindex,omitempty"`
	// +optional
	Runtime *FeatureState `json:"runtime,omitempty"`
	// SyNIC needs vpindex.
	// +optional
	SyNIC *FeatureState `json:"synic,omitempty"`
	// SyNICTimer needs synic and vpindex.
	// +optional
	SyNICTimer *SyNICTimer `json:"synictimer,omitempty"`
	// +optional
	Reset *FeatureState `json:"reset,omitempty"`
	// +optional
	VendorID *FeatureVendorID `json:"vendorid,omitempty"`
	// +optional
	Frequencies *FeatureState `json:"frequencies,omitempty"`
	// +optional
	Reenlightenment *FeatureState `json:"reenlightenment,omitempty"`
	// TLBFlush needs vpindex.
	// +optional
	TLBFlush *FeatureState `json:"tlbflush,omitempty"`
	// IPI needs vpindex.
	// +optional
	IPI *FeatureState `json:"ipi,omitempty"`
	// EVMCS needs vapic.
	// +optional
	EVMCS *FeatureState `json:"evmcs,omitempty"`
}

// Clock is the guest's real-time clock and timers. At most one of utc and timezone is set;
// neither is UTC.
type Clock struct {
	ClockOffset `json:",inline"`
	// Timer turns timers on or off and sets their tick policies.
	// +optional
	Timer *Timer `json:"timer,omitempty"`
}

// ClockOffset is where the guest's real-time clock starts at each boot.
type ClockOffset struct {
	// UTC starts the clock at UTC plus offsetSeconds.
	// +optional
	UTC *ClockOffsetUTC `json:"utc,omitempty"`
	// Timezone starts the clock at the local time of a zone of the tz database
	// ("America/New_York"), as a guest that keeps local time in its clock expects.
	// +optional
	Timezone *ClockOffsetTimezone `json:"timezone,omitempty"`
}

// ClockOffsetUTC is UTC with an offset.
type ClockOffsetUTC struct {
	// OffsetSeconds is added to UTC.
	// +optional
	OffsetSeconds *int `json:"offsetSeconds,omitempty"`
}

// ClockOffsetTimezone is a tz database zone name.
type ClockOffsetTimezone string

// Timer lists the timers of the guest.
type Timer struct {
	// HPET is the high precision event timer.
	// +optional
	HPET *HPETTimer `json:"hpet,omitempty"`
	// KVM is the paravirtual KVM clock (KVM only).
	// +optional
	KVM *KVMTimer `json:"kvm,omitempty"`
	// PIT is the i8254 programmable interval timer.
	// +optional
	PIT *PITTimer `json:"pit,omitempty"`
	// RTC is the real-time clock.
	// +optional
	RTC *RTCTimer `json:"rtc,omitempty"`
	// Hyperv is the Hyper-V reference time counter (KVM only).
	// +optional
	Hyperv *HypervTimer `json:"hyperv,omitempty"`
}

// HPETTimer is the HPET. Its tick policy is the hypervisor's own (QEMU has none to set).
type HPETTimer struct {
	// Enabled says whether the timer is present. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// PITTimer is the i8254 PIT.
type PITTimer struct {
	// TickPolicy is delay (ticks injected late, guest time delayed) or discard; it needs the
	// in-kernel PIT (KVM only). QEMU has no catchup for it.
	// +kubebuilder:validation:Enum=delay;discard
	// +optional
	TickPolicy string `json:"tickPolicy,omitempty"`
	// Enabled says whether the timer is present. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// RTCTimer is the real-time clock.
type RTCTimer struct {
	// TickPolicy is delay or catchup (missed ticks injected faster until the guest caught up).
	// +kubebuilder:validation:Enum=delay;catchup
	// +optional
	TickPolicy string `json:"tickPolicy,omitempty"`
	// Enabled must be true (or unset): the clock cannot be removed.
	// +optional
	Enabled *bool `json:"present,omitempty"`
	// Track is guest (the clock runs while the guest runs) or wall (it follows the host's clock).
	// +kubebuilder:validation:Enum=guest;wall
	// +optional
	Track string `json:"track,omitempty"`
}

// KVMTimer is the KVM paravirtual clock.
type KVMTimer struct {
	// Enabled says whether the timer is present. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// HypervTimer is the Hyper-V reference time counter.
type HypervTimer struct {
	// Enabled says whether the timer is present. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// Rng is a virtio entropy device. It has no settings (as KubeVirt's): its source is the host's
// /dev/urandom.
type Rng struct{}

// Disk connects a volume to the VMI as a disk or a cdrom.
type Disk struct {
	// Name is the device name; it must match the name of a volume.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// DiskDevice selects how the volume is presented to the guest. Defaults to a disk.
	DiskDevice `json:",inline"`
	// BootOrder is an integer > 0 that orders boot devices; lower values boot first.
	// Each disk or interface with a boot order must have a unique value.
	// +kubebuilder:validation:Minimum=1
	// +optional
	BootOrder *uint `json:"bootOrder,omitempty"`
	// Serial is the serial number of the disk device.
	// +optional
	Serial string `json:"serial,omitempty"`
	// Cache is the disk cache mode.
	// +optional
	Cache DriverCache `json:"cache,omitempty"`
	// IO is how the hypervisor does the disk's I/O: native (Linux AIO; needs cache none) or
	// threads (a thread pool). Unset is the hypervisor's default.
	// +optional
	IO DriverIO `json:"io,omitempty"`
	// DedicatedIOThread gives the disk an I/O thread of its own (virtio disks only).
	// +optional
	DedicatedIOThread *bool `json:"dedicatedIOThread,omitempty"`
	// BlockSize is the logical and physical block size the guest sees.
	// +optional
	BlockSize *BlockSize `json:"blockSize,omitempty"`
	// Shareable lets other VMs open the same volume for writing at the same time (a cluster
	// file system's shared disk); image locking is off for it.
	// +optional
	Shareable *bool `json:"shareable,omitempty"`
	// ErrorPolicy is what a read or write error does: stop pauses the VM, report gives the
	// guest the error, ignore drops it, enospace stops on a full host disk only.
	// +optional
	ErrorPolicy *DiskErrorPolicy `json:"errorPolicy,omitempty"`
}

// DriverIO is how a disk's I/O is done.
// +kubebuilder:validation:Enum=native;threads;default
type DriverIO string

// Disk I/O modes.
const (
	IONative  DriverIO = "native"
	IOThreads DriverIO = "threads"
	IODefault DriverIO = "default"
)

// DiskErrorPolicy is what a disk error does.
// +kubebuilder:validation:Enum=stop;ignore;report;enospace
type DiskErrorPolicy string

// Disk error policies.
const (
	DiskErrorPolicyStop     DiskErrorPolicy = "stop"
	DiskErrorPolicyIgnore   DiskErrorPolicy = "ignore"
	DiskErrorPolicyReport   DiskErrorPolicy = "report"
	DiskErrorPolicyEnospace DiskErrorPolicy = "enospace"
)

// BlockSize is the block size a disk shows the guest. Only custom is supported: matchVolume
// needs the volume's block size, which storage drivers do not report.
type BlockSize struct {
	// Custom sets the sizes.
	// +optional
	Custom *CustomBlockSize `json:"custom,omitempty"`
}

// CustomBlockSize is a logical and a physical block size in bytes, each a power of two from
// 512 to 65536, the logical at most the physical.
type CustomBlockSize struct {
	// +kubebuilder:validation:Minimum=512
	// +kubebuilder:validation:Maximum=65536
	Logical uint `json:"logical,omitempty"`
	// +kubebuilder:validation:Minimum=512
	// +kubebuilder:validation:Maximum=65536
	Physical uint `json:"physical,omitempty"`
}

// DiskDevice selects how a volume is presented to the guest. At most one of its members may be set.
// +kubebuilder:validation:XValidation:rule="(has(self.disk) ? 1 : 0) + (has(self.cdrom) ? 1 : 0) + (has(self.lun) ? 1 : 0) <= 1",message="disk, cdrom and lun are mutually exclusive"
type DiskDevice struct {
	// Disk attaches the volume as a disk.
	// +optional
	Disk *DiskTarget `json:"disk,omitempty"`
	// CDRom attaches the volume as a cdrom.
	// +optional
	CDRom *CDRomTarget `json:"cdrom,omitempty"`
	// LUN passes the guest's SCSI commands through to the volume, which must be a SCSI block
	// device on the node (a persistentVolumeClaim in volumeMode Block, or a hostDisk of type Disk
	// whose path is one).
	// +optional
	LUN *LunTarget `json:"lun,omitempty"`
}

// DiskBus is the bus a disk device is emulated on.
// +kubebuilder:validation:Enum=virtio;sata;scsi;usb
type DiskBus string

// Disk buses.
const (
	// DiskBusVirtio is a virtio-blk device.
	DiskBusVirtio DiskBus = "virtio"
	// DiskBusSATA is a SATA device.
	DiskBusSATA DiskBus = "sata"
	// DiskBusSCSI is a SCSI device.
	DiskBusSCSI DiskBus = "scsi"
	// DiskBusUSB is a USB device.
	DiskBusUSB DiskBus = "usb"
)

// DiskTarget attaches a volume as a disk.
type DiskTarget struct {
	// Bus is the type of disk device to emulate: virtio, sata, scsi or usb.
	// +optional
	Bus DiskBus `json:"bus,omitempty"`
	// ReadOnly makes the disk read-only. Defaults to false.
	// +optional
	ReadOnly bool `json:"readonly,omitempty"`
}

// LunTarget attaches a volume as a SCSI LUN: SCSI passthrough to the node's device.
type LunTarget struct {
	// Bus is the bus of the LUN: only scsi. Defaults to scsi.
	// +optional
	Bus DiskBus `json:"bus,omitempty"`
	// ReadOnly makes the LUN read-only. Defaults to false.
	// +optional
	ReadOnly bool `json:"readonly,omitempty"`
	// KubeVirt's reservation (SCSI persistent reservations through qemu-pr-helper) is not here:
	// core/kubevirtcompat refuses it with its reason.
}

// TrayState is whether the tray of a cdrom is open or closed.
// +kubebuilder:validation:Enum=open;closed
type TrayState string

// Tray states.
const (
	// TrayStateOpen is an open tray.
	TrayStateOpen TrayState = "open"
	// TrayStateClosed is a closed tray.
	TrayStateClosed TrayState = "closed"
)

// CDRomTarget attaches a volume as a cdrom.
type CDRomTarget struct {
	// Bus is the type of device to emulate: virtio, sata, scsi or usb.
	// +optional
	Bus DiskBus `json:"bus,omitempty"`
	// ReadOnly makes the cdrom read-only. Defaults to true.
	// +optional
	ReadOnly *bool `json:"readonly,omitempty"`
	// Tray is "open" or "closed". Defaults to closed.
	// +optional
	Tray TrayState `json:"tray,omitempty"`
}

// DriverCache is the cache mode of a disk.
// +kubebuilder:validation:Enum=none;writethrough;writeback
type DriverCache string

// Disk cache modes.
const (
	// CacheNone bypasses the host page cache.
	CacheNone DriverCache = "none"
	// CacheWriteThrough uses the host page cache for reads only.
	CacheWriteThrough DriverCache = "writethrough"
	// CacheWriteBack uses the host page cache for reads and writes.
	CacheWriteBack DriverCache = "writeback"
)

// Interface connects a network to the VMI.
type Interface struct {
	// Name is the logical name of the interface; it must match the name of a network.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Model is the interface model, for example virtio or e1000. Defaults to virtio.
	// +optional
	Model string `json:"model,omitempty"`
	// InterfaceBindingMethod selects how the interface is connected to the guest.
	InterfaceBindingMethod `json:",inline"`
	// Ports lists the ports forwarded to the VMI (masquerade binding). Empty forwards all.
	// +listType=atomic
	// +optional
	Ports []Port `json:"ports,omitempty"`
	// MacAddress is the interface MAC address, for example de:ad:00:00:be:af.
	// +optional
	MacAddress string `json:"macAddress,omitempty"`
	// BootOrder is an integer > 0 that orders boot devices; lower values boot first.
	// +kubebuilder:validation:Minimum=1
	// +optional
	BootOrder *uint `json:"bootOrder,omitempty"`
	// PciAddress places the interface at this PCI address of the guest ("0000:00:10.0"); only
	// the root bus (domain 0000, bus 00) is supported.
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$`
	// +optional
	PciAddress string `json:"pciAddress,omitempty"`
	// ACPIIndex is the interface's ACPI index (1 to 16383): guests that name interfaces by it
	// (systemd's "eno<index>") name this one the same wherever its PCI slot is.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16383
	// +optional
	ACPIIndex int `json:"acpiIndex,omitempty"`
	// State is up (the default) or down: the guest sees the link down (no carrier) from boot.
	// KubeVirt's absent (hot-unplug) is not supported.
	// +kubebuilder:validation:Enum=up;down;absent
	// +optional
	State InterfaceState `json:"state,omitempty"`
	// DHCPOptions are extra options the network driver's DHCP server sends the guest on this
	// interface, with the masquerade and the bridge binding (DHCPv4 only). A network driver that
	// does not declare the "dhcp-options" interface option cannot run the VMI.
	// +optional
	DHCPOptions *DHCPOptions `json:"dhcpOptions,omitempty"`
}

// DHCPOptions are extra DHCPv4 options for the guest of an interface. The server sends each one
// set in every OFFER and ACK, whether or not the client asks for it in its parameter request
// list (option 55); a client ignores an option it does not use. Each value is at most 255 bytes,
// the length of one DHCP option.
type DHCPOptions struct {
	// BootFileName is sent as the boot file name option (67), for a network boot.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	BootFileName string `json:"bootFileName,omitempty"`
	// TFTPServerName is sent as the TFTP server name option (66), for a network boot.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	TFTPServerName string `json:"tftpServerName,omitempty"`
	// NTPServers are IPv4 addresses ("192.0.2.1"), sent in this order as the NTP servers option
	// (42).
	// +kubebuilder:validation:MaxItems=63
	// +listType=atomic
	// +optional
	NTPServers []string `json:"ntpServers,omitempty"`
	// PrivateOptions are site-specific options (codes 224 to 254), each code at most once.
	// +kubebuilder:validation:MaxItems=31
	// +listType=atomic
	// +optional
	PrivateOptions []DHCPPrivateOptions `json:"privateOptions,omitempty"`
}

// Limits of DHCPOptions, which the webhook enforces.
const (
	// DHCPOptionMaxBytes is the longest value of one DHCP option (its length is one byte).
	DHCPOptionMaxBytes = 255
	// DHCPPrivateOptionMin to DHCPPrivateOptionMax are the site-specific option codes (RFC 3942),
	// the only ones DHCPPrivateOptions.Option may be (as KubeVirt's).
	DHCPPrivateOptionMin = 224
	DHCPPrivateOptionMax = 254
)

// DHCPPrivateOptions is one site-specific DHCP option: its code and its value, sent as the
// value's bytes.
type DHCPPrivateOptions struct {
	// Option is the option's code, 224 to 254.
	// +kubebuilder:validation:Minimum=224
	// +kubebuilder:validation:Maximum=254
	Option int `json:"option"`
	// Value is the option's value, sent as its bytes (at most 255).
	// +kubebuilder:validation:MaxLength=255
	Value string `json:"value"`
}

// InterfaceState is the link state of an interface.
type InterfaceState string

// Interface link states.
const (
	InterfaceStateUp     InterfaceState = "up"
	InterfaceStateDown   InterfaceState = "down"
	InterfaceStateAbsent InterfaceState = "absent"
)

// InterfaceBindingMethod selects how an interface is connected to the guest. At most one of its members may be set.
// +kubebuilder:validation:XValidation:rule="!(has(self.bridge) && has(self.masquerade))",message="bridge and masquerade are mutually exclusive"
type InterfaceBindingMethod struct {
	// Bridge connects the interface to the network through a linux bridge.
	// +optional
	Bridge *InterfaceBridge `json:"bridge,omitempty"`
	// Masquerade connects the interface to the network through NAT.
	// +optional
	Masquerade *InterfaceMasquerade `json:"masquerade,omitempty"`
}

// InterfaceBridge connects an interface through a linux bridge.
type InterfaceBridge struct{}

// InterfaceMasquerade connects an interface through NAT.
type InterfaceMasquerade struct{}

// Port is a port forwarded to the VMI.
type Port struct {
	// Name of the port; if set it must be an IANA_SVC_NAME unique within the VMI.
	// +optional
	Name string `json:"name,omitempty"`
	// Protocol is TCP or UDP. Defaults to TCP.
	// +kubebuilder:validation:Enum=TCP;UDP
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// Port is the port number, 0 < port < 65536.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// IOThreadsPolicy is how virtio disks get I/O threads.
type IOThreadsPolicy string

// I/O thread policies.
const (
	IOThreadsPolicyShared           IOThreadsPolicy = "shared"
	IOThreadsPolicyAuto             IOThreadsPolicy = "auto"
	IOThreadsPolicySupplementalPool IOThreadsPolicy = "supplementalPool"
)

// DiskIOThreads sizes an I/O thread pool.
type DiskIOThreads struct {
	// SupplementalPoolThreadCount is the pool's size for the supplementalPool policy (1 to 64).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	SupplementalPoolThreadCount *uint32 `json:"supplementalPoolThreadCount,omitempty"`
}
