// Package assemble assembles the driver-neutral domain spec of a VMI from the VMI and the results of
// the storage, network and device drivers. It is a package of its own, apart from core/domain,
// so that hypervisor drivers, which import core/domain for Validate, do not link the Kubernetes
// API types.
package assemble

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Names of the files Domain places in the run directory.
const (
	// SerialSocketName is the serial console's socket, when the VMI autoattaches it.
	SerialSocketName = "serial.sock"
	// VNCSocketName is the VNC server's socket, when the VMI autoattaches a graphics device.
	VNCSocketName = "vnc.sock"
)

// Interface bindings, as in networkv1.Interface.binding and basev1.Capabilities.bindings.
const (
	BindingBridge     = "bridge"
	BindingMasquerade = "masquerade"
)

// Defaults Domain applies where the VMI says nothing, as KubeVirt does.
const (
	// DefaultNICModel is the model of an interface that names none.
	DefaultNICModel = "virtio"
	// DefaultDiskBus is the bus of a disk that names none.
	DefaultDiskBus = domainv1.DiskBus_DISK_BUS_VIRTIO
	// DefaultCDROMBus is the bus of a cdrom that names none.
	DefaultCDROMBus = domainv1.DiskBus_DISK_BUS_SATA
	// MaxNICQueues caps the queue pairs networkInterfaceMultiqueue gives a virtio interface:
	// a Linux tap has at most 256 queues (as KubeVirt caps them).
	MaxNICQueues = 256
)

// NICQueues is the number of queue pairs interface iface of vmi gets: with
// networkInterfaceMultiqueue, the vCPUs (at most MaxNICQueues) for a virtio interface;
// else 0, one queue. It is 0 for one vCPU too, which is one queue. The node handler sends it to
// the network driver (Interface.queues, the tap's queues) and Domain to the hypervisor driver
// (NIC.queues): one rule for both.
func NICQueues(vmi *v1alpha1.VirtualMachineInstance, iface *v1alpha1.Interface) uint32 {
	d := &vmi.Spec.Domain
	if !ptr.Deref(d.Devices.NetworkInterfaceMultiQueue, false) || (iface.Model != "" && iface.Model != DefaultNICModel) {
		return 0
	}
	n, _ := d.VCPUs()
	if n <= 1 {
		return 0
	}
	return uint32(min(n, MaxNICQueues))
}

// Inputs is what Domain needs besides the VMI: the results of the storage, network and
// device drivers, and where the VM lives on the node.
type Inputs struct {
	// Disks are the storage driver's prepared disks, by volume name.
	Disks map[string]*storagev1.PreparedDisk
	// Interfaces are the network driver's results, by interface name.
	Interfaces map[string]*networkv1.InterfaceResult
	// HostDevices are the devices allocated to the VM (PCI functions), in order.
	HostDevices []*domainv1.HostDevice
	// RunDir is the VM's run directory (absolute); the serial console and VNC sockets go there.
	RunDir string
	// Sandbox is where the VM process must live.
	Sandbox *domainv1.Sandbox
	// Acceleration is the node's (or the HypervisorClass's) acceleration policy; the zero value
	// is ACCELERATION_AUTO.
	Acceleration domainv1.Acceleration
	// Kernel holds the node paths of the kernel and initrd of spec.domain.firmware.kernelBoot,
	// resolved by the caller from its container. Required when the VMI boots a kernel.
	Kernel *KernelArtifacts
	// HugepagesDir is a directory on a hugetlbfs of the VMI's huge page size, as the VM process
	// sees it (the sandbox's, SandboxSpec.HugepagesDir). Required when the VMI has
	// memory.hugepages.
	HugepagesDir string
	// CPUs are the host CPUs the VM process may run on (the sandbox's: its cgroup's cpuset), in
	// increasing order. Required when the VMI has cpu.dedicatedCpuPlacement: its vCPUs and
	// emulator are pinned onto the first of them.
	CPUs []uint32
	// HostNUMANodes maps each host CPU to its host NUMA node (/sys/devices/system/node). Required
	// when the VMI has cpu.numa.guestMappingPassthrough.
	HostNUMANodes map[uint32]uint32
	// ExactCPUs says that the sandbox asked for as many CPUs as the VMI's DedicatedCPUs, to be
	// its own (a Guaranteed launcher pod with whole CPUs): then CPUs must be that many, and
	// more means the node did not give it exclusive CPUs (its kubelet's CPU manager policy is
	// not static).
	ExactCPUs bool
	// DiskBus and CDROMBus replace DefaultDiskBus and DefaultCDROMBus for disks and cdroms whose
	// VMI names no bus (a guest without AHCI needs its cdroms on scsi, for one).
	DiskBus, CDROMBus domainv1.DiskBus
	// PersistentStateDir is the node directory of the VM's state that outlives the VMI (the
	// handler's Resolver.PersistentState), absolute. Required when the VMI has
	// devices.tpm.persistent or firmware.bootloader.efi.persistent, and ignored otherwise.
	PersistentStateDir string
}

// KernelArtifacts are the node paths of a kernel boot's files.
type KernelArtifacts struct {
	KernelPath string
	InitrdPath string
}

// Error is every problem Domain found, each naming the field of the VMI it is about
// ("spec.domain.devices.disks[1]: volume "x" not prepared"). It reaches a gRPC peer as
// InvalidArgument.
type Error []domain.FieldError

func (e Error) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// GRPCStatus makes an Error reach a gRPC peer as InvalidArgument.
func (e Error) GRPCStatus() *status.Status {
	return status.New(codes.InvalidArgument, e.Error())
}

// Paths of the VMI's fields, as Domain's errors name them.
const (
	fieldDomain     = "spec.domain"
	fieldDisks      = "spec.domain.devices.disks"
	fieldInterfaces = "spec.domain.devices.interfaces"
)

// Domain assembles the domain spec of vmi from the drivers' results. It is a pure function: it
// reads no file and calls nothing. It maps, with KubeVirt's defaults:
//
//   - cpu: sockets/cores/threads/model (a topology field left 0 is 1); without a topology the
//     vCPUs are the CPU limit, else request, rounded up, as sockets; else 1 vCPU
//     (v1alpha1.DomainSpec.VCPUs);
//   - cpu.dedicatedCpuPlacement: cpu.pinning, vCPU i on the i-th of in.CPUs and, with
//     isolateEmulatorThread, the emulator on the next one (Pinning);
//   - cpu.numa.guestMappingPassthrough: cpu.numa_cells, a guest node per host NUMA node of the
//     pinned vCPUs (NUMACells);
//   - memory: memory.guest, else resources.requests.memory, else resources.limits.memory;
//     memory.hugepages: the guest memory on huge pages of pageSize in in.HugepagesDir;
//   - machine.type; firmware: bios (default), efi (secureBoot defaults to true), kernelBoot
//     (in.Kernel's paths, kernelArgs as the command line), serial; uuid: firmware.uuid, else the
//     VMI's UID;
//   - disks: a disk (bus virtio), cdrom (bus sata, read-only unless it says otherwise) or lun
//     (SCSI passthrough, bus scsi only, readonly) per spec disk, with the prepared disk's path and format, bootOrder, cache and serial; a
//     volume no disk names gets a disk of its own, as KubeVirt's defaulting adds; io,
//     dedicatedIOThread (virtio), blockSize.custom, shareable, errorPolicy;
//   - interfaces: model (virtio), the network driver's MAC, tap and MTU, bootOrder, pciAddress
//     (the root bus), acpiIndex, state (up or down);
//   - the serial console and the VNC server on sockets in the run directory, unless
//     autoattachSerialConsole / autoattachGraphicsDevice is false;
//   - devices.rng: a virtio entropy device (rng); chassis: the SMBIOS chassis (type 3);
//   - features (acpi, smm, apic.endOfInterrupt, kvm.hidden, pvspinlock, the Hyper-V
//     enlightenments by their Hyper-V names, with what each needs checked) and clock (utc offset
//     or timezone, timers); see platform.go;
//   - inputs (bus usb unless set), and a usb tablet "default-0" when autoattachInputDevice is
//     true and inputs lists none; watchdog (i6300esb, action reset unless set); a memory balloon
//     unless autoattachMemBalloon is false; startStrategy Paused: start_paused; sound (ich9
//     unless ac97); blockMultiQueue: each virtio disk's queues are the vCPUs;
//     networkInterfaceMultiqueue: each virtio interface's queues (NICQueues);
//     useVirtioTransitional: virtio_transitional (modern-only virtio devices without it); tpm
//     unless its enabled is false;
//   - tpm.persistent and bootloader.efi.persistent: the TPM's and EFI's persistent, with
//     persistent_state_dir from Inputs.PersistentStateDir (required then).
//
// What the VMI asks for that the domain spec cannot say is an error with the word "not
// supported". Every error is in the returned Error.
func Domain(vmi *v1alpha1.VirtualMachineInstance, in Inputs) (*domainv1.DomainSpec, error) {
	if vmi == nil {
		return nil, Error{{Field: "vmi", Detail: "required"}}
	}
	b := &builder{vmi: vmi, in: in}
	spec := b.build()
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	// A failure here is a problem of the inputs (a relative path from a driver, say) that the
	// checks above do not see.
	if err := domain.Validate(spec); err != nil {
		return nil, Error{{Field: "domain spec", Detail: err.Error()}}
	}
	return spec, nil
}

type builder struct {
	vmi  *v1alpha1.VirtualMachineInstance
	in   Inputs
	errs Error
	// boot maps boot orders to the field that took them.
	boot map[uint]string
}

func (b *builder) fail(field, format string, args ...any) {
	b.errs = append(b.errs, domain.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

func (b *builder) build() *domainv1.DomainSpec {
	vmi, d := b.vmi, &b.vmi.Spec.Domain
	spec := &domainv1.DomainSpec{
		Id:           string(vmi.UID),
		Name:         vmi.Name,
		Acceleration: b.in.Acceleration,
		RunDir:       b.in.RunDir,
		Sandbox:      b.in.Sandbox,
		HostDevices:  b.in.HostDevices,
	}
	if vmi.UID == "" {
		b.fail("metadata.uid", "required")
	}
	if vmi.Namespace != "" {
		spec.Name = vmi.Namespace + "/" + vmi.Name
	}
	if len(vmi.Labels) > 0 {
		spec.Labels = make(map[string]string, len(vmi.Labels))
		for k, v := range vmi.Labels {
			spec.Labels[k] = v
		}
	}
	if b.in.RunDir == "" || !filepath.IsAbs(b.in.RunDir) {
		b.fail("runDir", "an absolute run directory is required, not %q", b.in.RunDir)
	}
	if d.Machine != nil && d.Machine.Type != "" {
		spec.Machine = &domainv1.Machine{Type: d.Machine.Type}
	}
	spec.Cpu = b.cpu()
	spec.Memory = b.memory()
	spec.Cpu.NumaCells = b.numaCells(spec.Cpu.GetPinning(), spec.Memory)
	spec.Firmware, spec.Uuid = b.firmware()
	b.boot = map[uint]string{}
	spec.Disks = b.disks()
	spec.Nics = b.nics()
	if !isFalse(d.Devices.AutoattachSerialConsole) {
		spec.Serial = &domainv1.Serial{SocketPath: filepath.Join(b.in.RunDir, SerialSocketName)}
	}
	if !isFalse(d.Devices.AutoattachGraphicsDevice) {
		spec.Vnc = &domainv1.VNC{SocketPath: filepath.Join(b.in.RunDir, VNCSocketName)}
	}
	if d.Devices.Rng != nil {
		spec.Rng = &domainv1.RNG{}
	}
	if c := d.Chassis; c != nil {
		spec.Chassis = &domainv1.Chassis{Manufacturer: c.Manufacturer, Version: c.Version, Serial: c.Serial, Asset: c.Asset, Sku: c.Sku}
	}
	spec.Features = b.features()
	spec.Clock = b.clock()
	spec.Inputs = b.inputs()
	spec.Watchdog = b.watchdog()
	spec.Balloon = b.balloon()
	spec.Sound = b.sound()
	if d.Devices.TPM.IsEnabled() {
		spec.Tpm = &domainv1.TPM{Persistent: vmi.Spec.PersistentTPM()}
	}
	spec.PersistentStateDir = b.persistentStateDir()
	spec.LaunchSecurity = b.launchSecurity()
	spec.VirtioTransitional = ptr.Deref(d.Devices.UseVirtioTransitional, false)
	b.ioThreads(spec)
	if q := d.Devices.BlockMultiQueue; q != nil && *q {
		for _, disk := range spec.Disks {
			if disk.GetBus() == domainv1.DiskBus_DISK_BUS_VIRTIO && disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_DISK {
				disk.Queues = spec.GetCpu().GetSockets() * spec.GetCpu().GetCores() * spec.GetCpu().GetThreads()
			}
		}
	}
	if ss := vmi.Spec.StartStrategy; ss != nil {
		if *ss != v1alpha1.StartStrategyPaused {
			b.fail("spec.startStrategy", "%q is not supported (Paused)", *ss)
		}
		spec.StartPaused = true
	}
	return spec
}

func isFalse(b *bool) bool { return b != nil && !*b }

func (b *builder) cpu() *domainv1.CPU {
	d := &b.vmi.Spec.Domain
	cpu := &domainv1.CPU{Sockets: 1, Cores: 1, Threads: 1}
	if d.CPU != nil {
		cpu.Model = d.CPU.Model
		for i, f := range d.CPU.Features {
			policy := f.Policy
			switch policy {
			case "":
				policy = "require"
			case "force", "require", "optional", "disable", "forbid":
			default:
				b.fail(fmt.Sprintf("%s.cpu.features[%d].policy", fieldDomain, i), "%q is not supported (force, require, optional, disable or forbid)", f.Policy)
			}
			cpu.Features = append(cpu.Features, &domainv1.CPUFeature{Name: f.Name, Policy: policy})
		}
	}
	n, from := d.VCPUs()
	field := fieldDomain + "." + string(from)
	switch {
	case from == v1alpha1.VCPUsDefault:
	case from == v1alpha1.VCPUsFromTopology:
		c := d.CPU
		cpu.Sockets, cpu.Cores, cpu.Threads = max(c.Sockets, 1), max(c.Cores, 1), max(c.Threads, 1)
		if n > domain.MaxVCPUs {
			b.fail(field, "%d vCPUs (sockets*cores*threads) exceed the maximum of %d", n, domain.MaxVCPUs)
		}
	case n >= 1 && n <= domain.MaxVCPUs:
		cpu.Sockets = uint32(n)
	default:
		q := d.Resources.Limits[corev1.ResourceCPU]
		if from == v1alpha1.VCPUsFromCPURequest {
			q = d.Resources.Requests[corev1.ResourceCPU]
		}
		if n < 1 {
			b.fail(field, "%s is negative", q.String())
		} else {
			b.fail(field, "%s vCPUs exceed the maximum of %d", q.String(), domain.MaxVCPUs)
		}
	}
	if n >= 1 && n <= domain.MaxVCPUs {
		cpu.Pinning = b.pinning(int(n))
	}
	return cpu
}

// pinning is the CPUPinning of a VMI of n vCPUs with cpu.dedicatedCpuPlacement (nil without):
// vCPU i on in.CPUs[i] and, with isolateEmulatorThread, the emulator on in.CPUs[n].
func (b *builder) pinning(n int) *domainv1.CPUPinning {
	d := &b.vmi.Spec.Domain
	need := int(d.DedicatedCPUs())
	if need == 0 {
		return nil
	}
	const field = fieldDomain + ".cpu.dedicatedCpuPlacement"
	have := b.in.CPUs
	switch {
	case len(have) == 0:
		b.fail(field, "the VMI's sandbox does not say which host CPUs it has")
		return nil
	case len(have) < need:
		what := "one per vCPU"
		if d.CPU.IsolateEmulatorThread {
			what += " and one for the emulator"
		}
		b.fail(field, "%d dedicated host CPUs needed (%s), and the VMI's sandbox has %d (%s)", need, what, len(have), CPUList(have))
		return nil
	case b.in.ExactCPUs && len(have) > need:
		b.fail(field, "the launcher pod has host CPUs %s, not %d of its own: the node's kubelet does not give exclusive CPUs (its CPU manager policy is not static), though the node is labelled %s=true",
			CPUList(have), need, v1alpha1.CPUManagerNodeLabel)
		return nil
	}
	p := &domainv1.CPUPinning{VcpuHostCpus: slices.Clone(have[:n])}
	if d.CPU.IsolateEmulatorThread {
		p.EmulatorHostCpus = []uint32{have[n]}
	}
	return p
}

// numaCells are the guest NUMA nodes of a VMI with cpu.numa.guestMappingPassthrough (nil
// without): one per host NUMA node that holds a vCPU's host CPU (pinning), in the host nodes'
// order, with those vCPUs, bound to that host node, and the guest memory split evenly among
// them in whole huge pages, the first nodes taking a page more where it does not divide.
func (b *builder) numaCells(pinning *domainv1.CPUPinning, mem *domainv1.Memory) []*domainv1.NUMACell {
	if !b.vmi.Spec.Domain.NUMAPassthrough() {
		return nil
	}
	const field = fieldDomain + ".cpu.numa.guestMappingPassthrough"
	page := mem.GetHugepages().GetPageSizeBytes()
	switch {
	case pinning == nil || page == 0:
		// dedicatedCpuPlacement or memory.hugepages is missing or failed: said elsewhere, or
		// here when the VMI does not ask.
		if d := &b.vmi.Spec.Domain; !d.CPU.DedicatedCPUPlacement || d.MemoryHugepages() == nil {
			b.fail(field, "requires cpu.dedicatedCpuPlacement and memory.hugepages")
		}
		return nil
	case b.in.HostNUMANodes == nil:
		b.fail(field, "the node does not say its NUMA nodes")
		return nil
	}
	byNode := map[uint32][]uint32{}
	for v, c := range pinning.GetVcpuHostCpus() {
		n, ok := b.in.HostNUMANodes[c]
		if !ok {
			b.fail(field, "host CPU %d (vCPU %d's) is in no NUMA node of the node", c, v)
			return nil
		}
		byNode[n] = append(byNode[n], uint32(v))
	}
	nodes := slices.Sorted(maps.Keys(byNode))
	pages := mem.GetGuestBytes() / page
	if pages < uint64(len(nodes)) {
		b.fail(field, "%d huge pages of guest memory cannot be split among %d NUMA nodes", pages, len(nodes))
		return nil
	}
	cells := make([]*domainv1.NUMACell, len(nodes))
	for i, n := range nodes {
		share := pages / uint64(len(nodes))
		if uint64(i) < pages%uint64(len(nodes)) {
			share++
		}
		cells[i] = &domainv1.NUMACell{Vcpus: byNode[n], MemoryBytes: share * page, HostNodes: []uint32{n}}
	}
	return cells
}

// CPUList writes CPU numbers in the kernel's list format ("0-3,8"), as cpuset.cpus and
// Cpus_allowed_list do; cpus are in increasing order.
func CPUList(cpus []uint32) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.FormatUint(uint64(cpus[i]), 10))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func (b *builder) memory() *domainv1.Memory {
	d := &b.vmi.Spec.Domain
	field := fieldDomain + ".memory.guest"
	var guest int64
	switch {
	case d.Memory != nil && d.Memory.Guest != nil:
		guest = d.Memory.Guest.Value()
	case !d.Resources.Requests.Memory().IsZero():
		guest, field = d.Resources.Requests.Memory().Value(), fieldDomain+".resources.requests.memory"
	case !d.Resources.Limits.Memory().IsZero():
		guest, field = d.Resources.Limits.Memory().Value(), fieldDomain+".resources.limits.memory"
	default:
		b.fail(field, "required (or resources.requests.memory)")
		return nil
	}
	if guest <= 0 {
		b.fail(field, "must be > 0")
		return nil
	}
	mem := &domainv1.Memory{GuestBytes: uint64(guest)}
	if h := d.MemoryHugepages(); h != nil {
		const hfield = fieldDomain + ".memory.hugepages"
		size := h.PageSizeBytes()
		switch {
		case size == 0:
			b.fail(hfield+".pageSize", "%q is not supported (%s)", h.PageSize, strings.Join(v1alpha1.HugepageSizes, " or "))
		case guest%size != 0:
			b.fail(field, "%d bytes is not a multiple of the huge page size %s", guest, h.PageSize)
		case b.in.HugepagesDir == "":
			b.fail(hfield, "the VMI's sandbox has no hugetlbfs of %s pages", h.PageSize)
		default:
			mem.Hugepages = &domainv1.Hugepages{PageSizeBytes: uint64(size), Path: b.in.HugepagesDir}
		}
	}
	return mem
}

func (b *builder) firmware() (*domainv1.Firmware, string) {
	fw := &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}}
	uuid := string(b.vmi.UID)
	f := b.vmi.Spec.Domain.Firmware
	if f == nil {
		return fw, uuid
	}
	const field = fieldDomain + ".firmware"
	if f.UUID != "" {
		uuid = string(f.UUID)
	}
	fw.Serial = f.Serial
	if bl := f.Bootloader; bl != nil && bl.BIOS != nil && bl.BIOS.UseSerial != nil && *bl.BIOS.UseSerial {
		fw.Boot = &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: true}}
	}
	efi := f.Bootloader != nil && f.Bootloader.EFI != nil
	if efi {
		secure := f.Bootloader.EFI.SecureBoot == nil || *f.Bootloader.EFI.SecureBoot
		fw.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: secure, Persistent: b.vmi.Spec.PersistentEFI()}}
	}
	if kb := f.KernelBoot; kb != nil {
		switch {
		case efi:
			b.fail(field+".kernelBoot", "not supported together with bootloader.efi (a kernel boots without firmware looking at disks)")
		case b.in.Kernel == nil || b.in.Kernel.KernelPath == "":
			b.fail(field+".kernelBoot", "the kernel of the kernel boot container is not resolved on the node")
		default:
			fw.Boot = &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
				KernelPath: b.in.Kernel.KernelPath,
				InitrdPath: b.in.Kernel.InitrdPath,
				Cmdline:    kb.KernelArgs,
			}}
		}
	}
	return fw, uuid
}

// persistentStateDir is the VM's persistent state directory, for a VMI that keeps a TPM's state
// or an EFI variable store beyond its life, and "" for one that keeps nothing. The error names
// the field that asks for persistence.
func (b *builder) persistentStateDir() string {
	if !b.vmi.Spec.NeedsPersistentState() {
		return ""
	}
	if dir := b.in.PersistentStateDir; dir == "" || !filepath.IsAbs(dir) {
		field := fieldDomain + ".devices.tpm.persistent"
		if !b.vmi.Spec.PersistentTPM() {
			field = fieldDomain + ".firmware.bootloader.efi.persistent"
		}
		b.fail(field, "needs the VM's persistent state directory on the node, and none is given (%q)", dir)
		return ""
	}
	return b.in.PersistentStateDir
}

// takeBoot records a boot order, failing when another device took it.
func (b *builder) takeBoot(field string, order *uint) uint32 {
	if order == nil {
		return 0
	}
	if *order == 0 {
		b.fail(field+".bootOrder", "must be > 0")
		return 0
	}
	if other, ok := b.boot[*order]; ok {
		b.fail(field+".bootOrder", "boot order %d is also used by %s", *order, other)
		return 0
	}
	b.boot[*order] = field
	return uint32(*order)
}

func busOf(bus v1alpha1.DiskBus, def domainv1.DiskBus) (domainv1.DiskBus, bool) {
	switch bus {
	case "":
		return def, true
	case v1alpha1.DiskBusVirtio:
		return domainv1.DiskBus_DISK_BUS_VIRTIO, true
	case v1alpha1.DiskBusSATA:
		return domainv1.DiskBus_DISK_BUS_SATA, true
	case v1alpha1.DiskBusSCSI:
		return domainv1.DiskBus_DISK_BUS_SCSI, true
	case v1alpha1.DiskBusUSB:
		return domainv1.DiskBus_DISK_BUS_USB, true
	}
	return domainv1.DiskBus_DISK_BUS_UNSPECIFIED, false
}

func (b *builder) disks() []*domainv1.Disk {
	vmi := b.vmi
	diskBus, cdromBus := DefaultDiskBus, DefaultCDROMBus
	if b.in.DiskBus != domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
		diskBus = b.in.DiskBus
	}
	if b.in.CDROMBus != domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
		cdromBus = b.in.CDROMBus
	}
	volumes := map[string]bool{}
	for _, v := range vmi.Spec.Volumes {
		volumes[v.Name] = true
	}
	var out []*domainv1.Disk
	named := map[string]bool{}
	for i, disk := range vmi.Spec.Domain.Devices.Disks {
		field := fmt.Sprintf("%s[%d]", fieldDisks, i)
		switch {
		case disk.Name == "":
			b.fail(field+".name", "required")
			continue
		case named[disk.Name]:
			b.fail(field+".name", "duplicate disk name %q", disk.Name)
			continue
		case !volumes[disk.Name]:
			b.fail(field+".name", "no volume %q in spec.volumes", disk.Name)
			continue
		}
		named[disk.Name] = true
		d := b.disk(field, disk, diskBus, cdromBus)
		if d != nil {
			out = append(out, d)
		}
	}
	// KubeVirt's defaulting gives a volume that no disk names a disk of its own.
	for i, v := range vmi.Spec.Volumes {
		if named[v.Name] || v.Name == "" {
			continue
		}
		named[v.Name] = true
		field := fmt.Sprintf("spec.volumes[%d]", i)
		if d := b.disk(field, v1alpha1.Disk{Name: v.Name}, diskBus, cdromBus); d != nil {
			out = append(out, d)
		}
	}
	return out
}

func (b *builder) disk(field string, disk v1alpha1.Disk, diskBus, cdromBus domainv1.DiskBus) *domainv1.Disk {
	p := b.in.Disks[disk.Name]
	if p == nil || p.GetPath() == "" {
		b.fail(field, "volume %q not prepared", disk.Name)
		return nil
	}
	d := &domainv1.Disk{
		Name:      disk.Name,
		Path:      p.GetPath(),
		Format:    p.GetFormat(),
		BootOrder: b.takeBoot(field, disk.BootOrder),
		Cache:     string(disk.Cache),
		Serial:    disk.Serial,
		ReadOnly:  p.GetReadOnly(),
	}
	var ok bool
	switch {
	case disk.CDRom != nil:
		c := disk.CDRom
		d.Device = domainv1.DiskDevice_DISK_DEVICE_CDROM
		if d.Bus, ok = busOf(c.Bus, cdromBus); !ok {
			b.fail(field+".cdrom.bus", "%q is not supported", c.Bus)
		}
		d.ReadOnly = d.ReadOnly || c.ReadOnly == nil || *c.ReadOnly
		if c.Tray == v1alpha1.TrayStateOpen {
			b.fail(field+".cdrom.tray", "open is not supported")
		}
	case disk.LUN != nil:
		l := disk.LUN
		d.Device = domainv1.DiskDevice_DISK_DEVICE_LUN
		if l.Bus != "" && l.Bus != v1alpha1.DiskBusSCSI {
			b.fail(field+".lun.bus", "%q is not supported (a lun is on scsi)", l.Bus)
		}
		d.Bus = domainv1.DiskBus_DISK_BUS_SCSI
		d.ReadOnly = d.ReadOnly || l.ReadOnly
	default:
		var bus v1alpha1.DiskBus
		if disk.Disk != nil {
			bus = disk.Disk.Bus
			d.ReadOnly = d.ReadOnly || disk.Disk.ReadOnly
		}
		if d.Bus, ok = busOf(bus, diskBus); !ok {
			b.fail(field+".disk.bus", "%q is not supported", bus)
		}
	}
	b.diskOptions(field, disk, d)
	return d
}

// diskOptions maps a disk's io, dedicatedIOThread, blockSize, shareable and errorPolicy.
func (b *builder) diskOptions(field string, disk v1alpha1.Disk, d *domainv1.Disk) {
	switch disk.IO {
	case "", v1alpha1.IODefault:
	case v1alpha1.IONative:
		if disk.Cache != v1alpha1.CacheNone {
			b.fail(field+".io", "native needs cache: none (Linux AIO is for direct I/O)")
		}
		d.Io = string(disk.IO)
	case v1alpha1.IOThreads:
		d.Io = string(disk.IO)
	default:
		b.fail(field+".io", "%q is not supported (native, threads or default)", disk.IO)
	}
	if disk.DedicatedIOThread != nil && *disk.DedicatedIOThread {
		if d.Bus != domainv1.DiskBus_DISK_BUS_VIRTIO {
			b.fail(field+".dedicatedIOThread", "only a virtio disk has an I/O thread of its own")
		}
		d.DedicatedIothread = true
	}
	if bs := disk.BlockSize; bs != nil {
		c := bs.Custom
		if c == nil {
			b.fail(field+".blockSize.custom", "required (matchVolume is not supported: storage drivers do not report a volume's block size)")
		} else {
			for _, v := range []struct {
				name string
				n    uint
			}{{"logical", c.Logical}, {"physical", c.Physical}} {
				if v.n < 512 || v.n > 65536 || v.n&(v.n-1) != 0 {
					b.fail(field+".blockSize.custom."+v.name, "%d is not a power of two from 512 to 65536", v.n)
				}
			}
			if c.Logical > c.Physical {
				b.fail(field+".blockSize.custom.logical", "%d is larger than the physical block size %d", c.Logical, c.Physical)
			}
			d.LogicalBlockSize, d.PhysicalBlockSize = uint32(c.Logical), uint32(c.Physical)
		}
	}
	d.Shareable = disk.Shareable != nil && *disk.Shareable
	if p := disk.ErrorPolicy; p != nil {
		switch *p {
		case v1alpha1.DiskErrorPolicyStop, v1alpha1.DiskErrorPolicyIgnore, v1alpha1.DiskErrorPolicyReport, v1alpha1.DiskErrorPolicyEnospace:
			d.ErrorPolicy = string(*p)
		default:
			b.fail(field+".errorPolicy", "%q is not supported (stop, ignore, report or enospace)", *p)
		}
	}
}

// Binding returns the binding of an interface ("bridge", "masquerade"), or "" when it names
// none of those.
func Binding(iface *v1alpha1.Interface) string {
	switch {
	case iface.Bridge != nil && iface.Masquerade == nil:
		return BindingBridge
	case iface.Masquerade != nil && iface.Bridge == nil:
		return BindingMasquerade
	}
	return ""
}

// CheckInterface reports what makes interface i of vmi unusable, as a domain.FieldError: an unknown
// network, no (or more than one) binding, masquerade on a network that is not the pod network.
// The handler checks every interface with it before it sets anything up; Domain does too.
func CheckInterface(vmi *v1alpha1.VirtualMachineInstance, i int) *domain.FieldError {
	iface := &vmi.Spec.Domain.Devices.Interfaces[i]
	field := fmt.Sprintf("%s[%d]", fieldInterfaces, i)
	var network *v1alpha1.Network
	for j := range vmi.Spec.Networks {
		if vmi.Spec.Networks[j].Name == iface.Name {
			network = &vmi.Spec.Networks[j]
		}
	}
	switch {
	case iface.Name == "":
		return &domain.FieldError{Field: field + ".name", Detail: "required"}
	case network == nil:
		return &domain.FieldError{Field: field + ".name", Detail: fmt.Sprintf("no network %q in spec.networks", iface.Name)}
	case iface.Bridge != nil && iface.Masquerade != nil:
		return &domain.FieldError{Field: field, Detail: "bridge and masquerade are mutually exclusive"}
	case Binding(iface) == "":
		return &domain.FieldError{Field: field, Detail: "a binding is required; bindings other than bridge and masquerade are not supported"}
	case network.Pod != nil && network.Multus != nil:
		return &domain.FieldError{Field: fmt.Sprintf("spec.networks[%s]", network.Name), Detail: "pod and multus are mutually exclusive"}
	case iface.Masquerade != nil && network.Multus != nil:
		return &domain.FieldError{Field: field + ".masquerade", Detail: "not supported on a multus network (only on the pod network)"}
	}
	return nil
}

func (b *builder) nics() []*domainv1.NIC {
	var out []*domainv1.NIC
	named := map[string]bool{}
	taken := map[string]string{} // PCI addresses and ACPI indexes, by the field that has each
	for i := range b.vmi.Spec.Domain.Devices.Interfaces {
		iface := &b.vmi.Spec.Domain.Devices.Interfaces[i]
		field := fmt.Sprintf("%s[%d]", fieldInterfaces, i)
		if fe := CheckInterface(b.vmi, i); fe != nil {
			b.errs = append(b.errs, *fe)
			continue
		}
		if named[iface.Name] {
			b.fail(field+".name", "duplicate interface name %q", iface.Name)
			continue
		}
		named[iface.Name] = true
		r := b.in.Interfaces[iface.Name]
		if r == nil || (r.GetTapName() == "") {
			b.fail(field, "interface %q not set up", iface.Name)
			continue
		}
		mac := r.GetMac()
		if mac == "" {
			mac = iface.MacAddress
		}
		if mac == "" {
			b.fail(field, "interface %q has no MAC address (the network driver returned none)", iface.Name)
			continue
		}
		model := iface.Model
		if model == "" {
			model = DefaultNICModel
		}
		nic := &domainv1.NIC{
			Name:      iface.Name,
			TapName:   r.GetTapName(),
			Mac:       mac,
			Model:     model,
			Mtu:       r.GetMtu(),
			BootOrder: b.takeBoot(field, iface.BootOrder),
			Queues:    NICQueues(b.vmi, iface),
		}
		b.nicOptions(field, *iface, nic, taken)
		out = append(out, nic)
	}
	return out
}

// pciAddressRE is a PCI address on the root bus: domain 0000, bus 00, slot, function.
var pciAddressRE = regexp.MustCompile(`^0000:00:([0-1][0-9a-fA-F])\.([0-7])$`)

// nicOptions maps an interface's pciAddress (the root bus only; each address once, slot 0 is
// the host bridge's), acpiIndex (each index once) and state.
func (b *builder) nicOptions(field string, iface v1alpha1.Interface, nic *domainv1.NIC, seen map[string]string) {
	if a := iface.PciAddress; a != "" {
		m := pciAddressRE.FindStringSubmatch(strings.ToLower(a))
		switch {
		case m == nil:
			b.fail(field+".pciAddress", "%q is not a PCI address on the root bus (0000:00:<slot>.<function>)", a)
		case m[1] == "00":
			b.fail(field+".pciAddress", "%q: slot 0 is the host bridge's", a)
		case seen["pci "+strings.ToLower(a)] != "":
			b.fail(field+".pciAddress", "%q is also the address of %s", a, seen["pci "+strings.ToLower(a)])
		default:
			seen["pci "+strings.ToLower(a)] = field
			nic.PciAddress = strings.ToLower(a)
		}
	}
	if i := iface.ACPIIndex; i != 0 {
		key := fmt.Sprintf("acpi %d", i)
		switch {
		case i < 1 || i > 16383:
			b.fail(field+".acpiIndex", "%d is out of range (1-16383)", i)
		case seen[key] != "":
			b.fail(field+".acpiIndex", "%d is also the ACPI index of %s", i, seen[key])
		default:
			seen[key] = field
			nic.AcpiIndex = uint32(i)
		}
	}
	switch iface.State {
	case "", v1alpha1.InterfaceStateUp:
	case v1alpha1.InterfaceStateDown:
		nic.LinkDown = true
	case v1alpha1.InterfaceStateAbsent:
		b.fail(field+".state", "absent (hot-unplug) is not supported: remove the interface and its network")
	default:
		b.fail(field+".state", "%q is not supported (up or down)", iface.State)
	}
}
