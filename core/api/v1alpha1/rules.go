package v1alpha1

import (
	"math"
	"math/bits"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/layout"
)

// GracePeriodSeconds is how long, in seconds, the guest of a VMI of this spec may take to shut
// down before it is forced: terminationGracePeriodSeconds, else layout.DefaultGracePeriod (30 s,
// a pod's default). A negative value, which the API server and the webhook reject, counts as
// unset. The launcher pod, the node agent and standalone runs all take the grace period from
// here (or from GracePeriod).
func (s *VirtualMachineInstanceSpec) GracePeriodSeconds() int64 {
	if g := s.TerminationGracePeriodSeconds; g != nil && *g >= 0 {
		return *g
	}
	return int64(layout.DefaultGracePeriod / time.Second)
}

// GracePeriod is GracePeriodSeconds as a duration, at most the longest time.Duration.
func (s *VirtualMachineInstanceSpec) GracePeriod() time.Duration {
	g := s.GracePeriodSeconds()
	if g > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(g) * time.Second
}

// SerialConsoleLogged says whether the VMI's serial console is logged to its launcher pod's
// guest-console-log container: it has the default serial console (autoattachSerialConsole not
// false) and logSerialConsole is not false. The launcher pod has the container, and the node
// agent writes the console log it prints, only then.
func (s *VirtualMachineInstanceSpec) SerialConsoleLogged() bool {
	d := s.Domain.Devices
	return !(d.AutoattachSerialConsole != nil && !*d.AutoattachSerialConsole) &&
		!(d.LogSerialConsole != nil && !*d.LogSerialConsole)
}

// PersistentTPM says whether the VMI has a TPM whose state outlives it (tpm.persistent).
func (s *VirtualMachineInstanceSpec) PersistentTPM() bool {
	t := s.Domain.Devices.TPM
	return t.IsEnabled() && t.Persistent != nil && *t.Persistent
}

// PersistentEFI says whether the VMI boots EFI firmware whose variable store outlives it
// (firmware.bootloader.efi.persistent).
func (s *VirtualMachineInstanceSpec) PersistentEFI() bool {
	f := s.Domain.Firmware
	if f == nil || f.Bootloader == nil || f.Bootloader.EFI == nil {
		return false
	}
	p := f.Bootloader.EFI.Persistent
	return p != nil && *p
}

// NeedsPersistentState says whether the VMI keeps state on its VM's persistent state claim:
// a persistent TPM or persistent EFI variables. Its launcher pod mounts that claim.
func (s *VirtualMachineInstanceSpec) NeedsPersistentState() bool {
	return s.PersistentTPM() || s.PersistentEFI()
}

// VCPUSource is the field of a DomainSpec that its vCPU count comes from (DomainSpec.VCPUs), as
// a path relative to spec.domain; empty for the default of one vCPU.
type VCPUSource string

// Sources of DomainSpec.VCPUs.
const (
	// VCPUsDefault is one vCPU, for a domain that says nothing about CPUs.
	VCPUsDefault VCPUSource = ""
	// VCPUsFromTopology is cpu.sockets × cpu.cores × cpu.threads.
	VCPUsFromTopology VCPUSource = "cpu"
	// VCPUsFromCPULimit is resources.limits.cpu, rounded up.
	VCPUsFromCPULimit VCPUSource = "resources.limits.cpu"
	// VCPUsFromCPURequest is resources.requests.cpu, rounded up.
	VCPUsFromCPURequest VCPUSource = "resources.requests.cpu"
)

// VCPUs is the number of vCPUs the domain asks for, by KubeVirt's rule, and the field it comes
// from: with a topology (any of cpu.sockets, cpu.cores, cpu.threads set) sockets × cores ×
// threads, a field left 0 counting as 1; without one, the CPU limit, else the CPU request,
// rounded up to a whole vCPU; else 1. The webhook's defaults and validation, the launcher pod's
// CPU request and the node's domain spec all count vCPUs with it.
//
// The count is not bounded by what a domain may have (core/domain.MaxVCPUs, which callers
// check): it saturates at math.MaxInt64, and a negative CPU quantity, which validation
// rejects, gives a negative count.
func (d *DomainSpec) VCPUs() (n int64, from VCPUSource) {
	if c := d.CPU; c != nil && (c.Sockets != 0 || c.Cores != 0 || c.Threads != 0) {
		// Two uint32 factors fit in a uint64; the third may not.
		hi, lo := bits.Mul64(uint64(max(c.Sockets, 1))*uint64(max(c.Cores, 1)), uint64(max(c.Threads, 1)))
		if hi != 0 || lo > math.MaxInt64 {
			return math.MaxInt64, VCPUsFromTopology
		}
		return int64(lo), VCPUsFromTopology
	}
	if q, ok := d.Resources.Limits[corev1.ResourceCPU]; ok && !q.IsZero() {
		return wholeCPUs(q), VCPUsFromCPULimit
	}
	if q, ok := d.Resources.Requests[corev1.ResourceCPU]; ok && !q.IsZero() {
		return wholeCPUs(q), VCPUsFromCPURequest
	}
	return 1, VCPUsDefault
}

// wholeCPUs is q rounded away from zero to a whole number (1m is 1), within the int64 range.
func wholeCPUs(q resource.Quantity) int64 {
	switch {
	case q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) >= 0:
		return math.MaxInt64
	case q.Cmp(*resource.NewQuantity(math.MinInt64, resource.DecimalSI)) <= 0:
		return math.MinInt64
	}
	return q.Value()
}

// HardwareVirtualisationFields are the fields of d, as paths relative to spec.domain, that only
// mean something under hardware virtualisation (KVM): Hyper-V enlightenments and timer, a hidden
// KVM, paravirtual spinlocks and end of interrupt, the KVM clock, each asked for (turning off what
// emulation lacks anyway is not), a PIT tick policy,
// the host-passthrough CPU model, AMD SEV. A VMI with any is placed only on nodes whose hypervisor driver
// fingerprints accel=kvm; empty when it has none.
func (d *DomainSpec) HardwareVirtualisationFields() []string {
	var out []string
	if d.CPU != nil && d.CPU.Model == "host-passthrough" {
		out = append(out, "cpu.model")
	}
	if d.LaunchSecurity != nil && d.LaunchSecurity.SEV != nil {
		out = append(out, "launchSecurity.sev")
	}
	if f := d.Features; f != nil {
		if f.APIC != nil && f.APIC.EndOfInterrupt {
			out = append(out, "features.apic.endOfInterrupt")
		}
		if f.Hyperv != nil {
			out = append(out, "features.hyperv")
		}
		if f.KVM != nil && f.KVM.Hidden {
			out = append(out, "features.kvm.hidden")
		}
		if f.Pvspinlock != nil && (f.Pvspinlock.Enabled == nil || *f.Pvspinlock.Enabled) {
			out = append(out, "features.pvspinlock")
		}
	}
	if c := d.Clock; c != nil && c.Timer != nil {
		t := c.Timer
		if t.KVM != nil && (t.KVM.Enabled == nil || *t.KVM.Enabled) {
			out = append(out, "clock.timer.kvm")
		}
		if t.Hyperv != nil && (t.Hyperv.Enabled == nil || *t.Hyperv.Enabled) {
			out = append(out, "clock.timer.hyperv")
		}
		if t.PIT != nil && t.PIT.TickPolicy != "" {
			out = append(out, "clock.timer.pit.tickPolicy")
		}
	}
	return out
}

// GuestHostname is the host name of the VMI's guest and launcher pod: spec.hostname, else the
// VMI's name made a DNS label (dots become dashes, at most 63 characters, no trailing dash), as
// KubeVirt does. The launcher pod's hostname, the cloud-init meta-data's local-hostname and the
// DHCP answers of the network driver all take it from here.
func (vmi *VirtualMachineInstance) GuestHostname() string {
	if vmi.Spec.Hostname != "" {
		return vmi.Spec.Hostname
	}
	h := strings.ReplaceAll(vmi.Name, ".", "-")
	if len(h) > validation.DNS1123LabelMaxLength {
		h = h[:validation.DNS1123LabelMaxLength]
	}
	return strings.TrimRight(h, "-")
}

// Huge page sizes a VMI's memory.hugepages.pageSize may name: those of Linux on x86_64.
const (
	HugepageSize2Mi = "2Mi"
	HugepageSize1Gi = "1Gi"
)

// HugepageSizes are the page sizes memory.hugepages.pageSize may name, smallest first.
var HugepageSizes = []string{HugepageSize2Mi, HugepageSize1Gi}

// PageSizeBytes is the huge page size in bytes, or 0 when pageSize is not one of HugepageSizes.
func (h *Hugepages) PageSizeBytes() int64 {
	switch h.PageSize {
	case HugepageSize2Mi:
		return 2 << 20
	case HugepageSize1Gi:
		return 1 << 30
	}
	return 0
}

// ResourceName is the node resource of the huge pages, hugepages-<pageSize> (hugepages-2Mi),
// which the launcher pod requests for the guest memory.
func (h *Hugepages) ResourceName() corev1.ResourceName {
	return corev1.ResourceName(corev1.ResourceHugePagesPrefix + h.PageSize)
}

// HugepagesMedium is the medium of the launcher pod's emptyDir of the huge pages
// (HugePages-<pageSize>): the kubelet mounts a hugetlbfs of that page size.
func (h *Hugepages) HugepagesMedium() corev1.StorageMedium {
	return corev1.StorageMedium(string(corev1.StorageMediumHugePagesPrefix) + h.PageSize)
}

// DedicatedCPUs is the number of exclusive host CPUs a domain with cpu.dedicatedCpuPlacement
// asks for: one per vCPU (VCPUs), and one more for the emulator's threads with
// cpu.isolateEmulatorThread. It is 0 without dedicatedCpuPlacement. The launcher pod requests
// that many CPUs and the node pins onto that many.
func (d *DomainSpec) DedicatedCPUs() int64 {
	if d.CPU == nil || !d.CPU.DedicatedCPUPlacement {
		return 0
	}
	n, _ := d.VCPUs()
	if d.CPU.IsolateEmulatorThread && n < math.MaxInt64 {
		n++
	}
	return n
}

// NUMAPassthrough says whether the domain asks for cpu.numa.guestMappingPassthrough.
func (d *DomainSpec) NUMAPassthrough() bool {
	return d.CPU != nil && d.CPU.NUMA != nil && d.CPU.NUMA.GuestMappingPassthrough != nil
}

// MemoryHugepages is memory.hugepages, nil when the guest memory is not on huge pages.
func (d *DomainSpec) MemoryHugepages() *Hugepages {
	if d.Memory == nil {
		return nil
	}
	return d.Memory.Hugepages
}

// LocalDisk is a writable disk of a VMI whose data lives on the VMI's node alone.
type LocalDisk struct {
	// Name is the disk's (and its volume's) name.
	Name string
	// Overlay: the disk is a containerDisk's writable overlay over an image every node can
	// pull, so only the overlay's own data is the VMI's; else (an emptyDisk) the whole disk is.
	Overlay bool
}

// LocalWritableDisks are the VMI's writable node-local disks, in the order of its disks: a
// containerDisk's overlay and an emptyDisk. A live migration must copy them to the target.
// Shared volumes (a ReadWriteMany claim, a shared hostDisk) are reached from any node, cloud-init
// media are made again from the spec, and read-only disks are not written: none is listed.
func (s *VirtualMachineInstanceSpec) LocalWritableDisks() []LocalDisk {
	volumes := map[string]*Volume{}
	for i := range s.Volumes {
		volumes[s.Volumes[i].Name] = &s.Volumes[i]
	}
	var out []LocalDisk
	for _, d := range s.Domain.Devices.Disks {
		v := volumes[d.Name]
		if v == nil || d.CDRom != nil && (d.CDRom.ReadOnly == nil || *d.CDRom.ReadOnly) || d.Disk != nil && d.Disk.ReadOnly {
			continue
		}
		switch {
		case v.ContainerDisk != nil:
			out = append(out, LocalDisk{Name: d.Name, Overlay: true})
		case v.EmptyDisk != nil:
			out = append(out, LocalDisk{Name: d.Name})
		}
	}
	return out
}
