package assemble

import (
	"fmt"
	"strings"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// The platform parts of the domain: features, clock, inputs, watchdog and balloon. Each maps a
// VMI field to its domain spec field; what the domain spec cannot say (an x86_64 guest without
// a local APIC, a real-time clock removed) is an error naming the VMI field.

const (
	fieldFeatures = fieldDomain + ".features"
	fieldClock    = fieldDomain + ".clock"
	fieldDevices  = fieldDomain + ".devices"
)

// DefaultInputName is the name of the tablet autoattachInputDevice adds.
const DefaultInputName = "default-0"

// toggle is a VMI feature state as a domain toggle: unset is the machine type's default, a
// listed state without enabled is on (KubeVirt's reading).
func toggle(s *v1alpha1.FeatureState) domainv1.Toggle {
	if s == nil {
		return domainv1.Toggle_TOGGLE_DEFAULT
	}
	return onOff(s.Enabled)
}

func onOff(enabled *bool) domainv1.Toggle {
	if isFalse(enabled) {
		return domainv1.Toggle_TOGGLE_OFF
	}
	return domainv1.Toggle_TOGGLE_ON
}

func on(s *v1alpha1.FeatureState) bool { return toggle(s) == domainv1.Toggle_TOGGLE_ON }

func (b *builder) features() *domainv1.Features {
	f := b.vmi.Spec.Domain.Features
	if f == nil {
		return nil
	}
	out := &domainv1.Features{
		Smm:        toggle(f.SMM),
		Pvspinlock: toggle(f.Pvspinlock),
		KvmHidden:  f.KVM != nil && f.KVM.Hidden,
	}
	if m := b.vmi.Spec.Domain.Machine; isFalse(f.ACPI.Enabled) && (m == nil || m.Type == "" || m.Type == "q35" || strings.HasPrefix(m.Type, "pc-q35-")) {
		// The ICH9 chipset's power management is ACPI, and SeaBIOS makes tables where the
		// hypervisor gives none: a q35 guest has ACPI whatever the flag says.
		b.fail(fieldFeatures+".acpi.enabled", "a q35 machine always has ACPI: disabling it needs machine type pc")
	}
	if f.ACPI.Enabled != nil {
		// acpi: {} and no acpi at all read the same: the default, on.
		out.Acpi = onOff(f.ACPI.Enabled)
	}
	if a := f.APIC; a != nil {
		if isFalse(a.Enabled) {
			b.fail(fieldFeatures+".apic.enabled", "an x86_64 guest always has a local APIC: disabling it is not supported")
		}
		out.ApicEoi = a.EndOfInterrupt
	}
	if h := f.Hyperv; h != nil {
		b.hyperv(h, out)
	}
	return out
}

// hyperv lists the enlightenments h turns on, by their Hyper-V names, and checks what each needs.
func (b *builder) hyperv(h *v1alpha1.FeatureHyperv, out *domainv1.Features) {
	p := fieldFeatures + ".hyperv"
	flags := []struct {
		name, field string
		on          bool
	}{
		{"relaxed", "relaxed", on(h.Relaxed)},
		{"vapic", "vapic", on(h.VAPIC)},
		{"spinlocks", "spinlocks", h.Spinlocks != nil && !isFalse(h.Spinlocks.Enabled)},
		{"vpindex", "vpindex", on(h.VPIndex)},
		{"runtime", "runtime", on(h.Runtime)},
		{"synic", "synic", on(h.SyNIC)},
		{"stimer", "synictimer", h.SyNICTimer != nil && !isFalse(h.SyNICTimer.Enabled)},
		{"stimer-direct", "synictimer.direct", h.SyNICTimer != nil && !isFalse(h.SyNICTimer.Enabled) && on(h.SyNICTimer.Direct)},
		{"reset", "reset", on(h.Reset)},
		{"vendor-id", "vendorid", h.VendorID != nil && !isFalse(h.VendorID.Enabled)},
		{"frequencies", "frequencies", on(h.Frequencies)},
		{"reenlightenment", "reenlightenment", on(h.Reenlightenment)},
		{"tlbflush", "tlbflush", on(h.TLBFlush)},
		{"ipi", "ipi", on(h.IPI)},
		{"evmcs", "evmcs", on(h.EVMCS)},
	}
	set := map[string]bool{}
	for _, f := range flags {
		if f.on {
			out.Hyperv = append(out.Hyperv, f.name)
			set[f.name] = true
		}
	}
	// What each enlightenment needs, as Hyper-V's specification (and KVM) require.
	for _, dep := range []struct{ name, field, needs, needsField string }{
		{"synic", "synic", "vpindex", "vpindex"},
		{"stimer", "synictimer", "synic", "synic"},
		{"stimer", "synictimer", "time", "the hyperv timer (clock.timer.hyperv)"},
		{"tlbflush", "tlbflush", "vpindex", "vpindex"},
		{"ipi", "ipi", "vpindex", "vpindex"},
		{"evmcs", "evmcs", "vapic", "vapic"},
	} {
		if !set[dep.name] {
			continue
		}
		has := set[dep.needs]
		if dep.needs == "time" {
			t := b.vmi.Spec.Domain.Clock
			has = t != nil && t.Timer != nil && t.Timer.Hyperv != nil && !isFalse(t.Timer.Hyperv.Enabled)
		}
		if !has {
			b.fail(p+"."+dep.field, "needs %s", dep.needsField)
		}
	}
	if s := h.Spinlocks; s != nil && s.Retries != nil {
		if *s.Retries < 4096 {
			b.fail(p+".spinlocks.spinlocks", "%d retries is fewer than the minimum of 4096", *s.Retries)
		}
		out.HypervSpinlockRetries = *s.Retries
	}
	if v := h.VendorID; v != nil && set["vendor-id"] {
		if len(v.VendorID) > 12 {
			b.fail(p+".vendorid.vendorid", "%q is longer than 12 characters", v.VendorID)
		}
		out.HypervVendorId = v.VendorID
	}
}

func (b *builder) clock() *domainv1.Clock {
	c := b.vmi.Spec.Domain.Clock
	if c == nil {
		return nil
	}
	out := &domainv1.Clock{}
	if c.UTC != nil && c.Timezone != nil {
		b.fail(fieldClock, "utc and timezone are mutually exclusive")
	}
	if c.UTC != nil && c.UTC.OffsetSeconds != nil {
		out.UtcOffsetSeconds = int64(*c.UTC.OffsetSeconds)
	}
	if c.Timezone != nil {
		if *c.Timezone == "" {
			b.fail(fieldClock+".timezone", "a time zone name is required")
		}
		out.Timezone = string(*c.Timezone)
	}
	t := c.Timer
	if t == nil {
		return out
	}
	tp := fieldClock + ".timer"
	if t.HPET != nil {
		out.Hpet = onOff(t.HPET.Enabled)
	}
	if t.PIT != nil {
		out.Pit = onOff(t.PIT.Enabled)
		out.PitTickPolicy = t.PIT.TickPolicy
	}
	if t.RTC != nil {
		if isFalse(t.RTC.Enabled) {
			b.fail(tp+".rtc.present", "the real-time clock cannot be removed: present: false is not supported")
		}
		out.RtcTickPolicy, out.RtcTrack = t.RTC.TickPolicy, t.RTC.Track
	}
	if t.KVM != nil {
		out.Kvm = onOff(t.KVM.Enabled)
	}
	if t.Hyperv != nil {
		out.Hyperv = onOff(t.Hyperv.Enabled)
	}
	return out
}

// inputs are the VMI's input devices, and the tablet autoattachInputDevice adds when it lists
// none. An input without a bus is on usb.
func (b *builder) inputs() []*domainv1.Input {
	devs := &b.vmi.Spec.Domain.Devices
	in := devs.Inputs
	if len(in) == 0 && devs.AutoattachInputDevice != nil && *devs.AutoattachInputDevice {
		in = []v1alpha1.Input{{Name: DefaultInputName, Type: v1alpha1.InputTypeTablet}}
	}
	var out []*domainv1.Input
	for i, d := range in {
		bus := d.Bus
		if bus == "" {
			bus = v1alpha1.InputBusUSB
		}
		switch d.Type {
		case v1alpha1.InputTypeTablet, v1alpha1.InputTypeKeyboard:
		default:
			b.fail(fmt.Sprintf("%s.inputs[%d].type", fieldDevices, i), "%q is not supported (tablet or keyboard)", d.Type)
		}
		switch bus {
		case v1alpha1.InputBusUSB, v1alpha1.InputBusVirtio:
		default:
			b.fail(fmt.Sprintf("%s.inputs[%d].bus", fieldDevices, i), "%q is not supported (usb or virtio)", d.Bus)
		}
		out = append(out, &domainv1.Input{Name: d.Name, Type: string(d.Type), Bus: string(bus)})
	}
	return out
}

// watchdog is the VMI's watchdog: an i6300esb, reset when it expires unless it says otherwise.
func (b *builder) watchdog() *domainv1.Watchdog {
	w := b.vmi.Spec.Domain.Devices.Watchdog
	if w == nil {
		return nil
	}
	action := v1alpha1.WatchdogActionReset
	if w.I6300ESB != nil && w.I6300ESB.Action != "" {
		action = w.I6300ESB.Action
	}
	switch action {
	case v1alpha1.WatchdogActionPoweroff, v1alpha1.WatchdogActionReset, v1alpha1.WatchdogActionShutdown:
	default:
		b.fail(fieldDevices+".watchdog.i6300esb.action", "%q is not supported (poweroff, reset or shutdown)", action)
	}
	return &domainv1.Watchdog{Name: w.Name, Model: "i6300esb", Action: string(action)}
}

// sound is the VMI's sound card, ich9 unless it says ac97.
func (b *builder) sound() *domainv1.Sound {
	s := b.vmi.Spec.Domain.Devices.Sound
	if s == nil {
		return nil
	}
	model := s.Model
	switch model {
	case "":
		model = "ich9"
	case "ich9", "ac97":
	default:
		b.fail(fieldDevices+".sound.model", "%q is not supported (ich9 or ac97)", s.Model)
	}
	return &domainv1.Sound{Name: s.Name, Model: model}
}

// ioThreads spreads the virtio disks without a dedicated I/O thread over the pool the
// ioThreadsPolicy makes: one thread (shared), at most two per vCPU (auto), or
// supplementalPoolThreadCount (supplementalPool), in disk order, round robin.
func (b *builder) ioThreads(spec *domainv1.DomainSpec) {
	d := &b.vmi.Spec.Domain
	if d.IOThreadsPolicy == nil {
		if d.IOThreads != nil {
			b.fail(fieldDomain+".ioThreads", "needs ioThreadsPolicy supplementalPool")
		}
		return
	}
	var disks []*domainv1.Disk
	for _, disk := range spec.GetDisks() {
		if disk.GetBus() == domainv1.DiskBus_DISK_BUS_VIRTIO && disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_DISK && !disk.GetDedicatedIothread() {
			disks = append(disks, disk)
		}
	}
	vcpus := spec.GetCpu().GetSockets() * spec.GetCpu().GetCores() * spec.GetCpu().GetThreads()
	var pool uint32
	switch *d.IOThreadsPolicy {
	case v1alpha1.IOThreadsPolicyShared:
		pool = 1
	case v1alpha1.IOThreadsPolicyAuto:
		pool = min(uint32(len(disks)), 2*max(vcpus, 1))
	case v1alpha1.IOThreadsPolicySupplementalPool:
		if d.IOThreads == nil || d.IOThreads.SupplementalPoolThreadCount == nil || *d.IOThreads.SupplementalPoolThreadCount == 0 {
			b.fail(fieldDomain+".ioThreads.supplementalPoolThreadCount", "required (> 0) with ioThreadsPolicy supplementalPool")
			return
		}
		pool = *d.IOThreads.SupplementalPoolThreadCount
	default:
		b.fail(fieldDomain+".ioThreadsPolicy", "%q is not supported (shared, auto or supplementalPool)", *d.IOThreadsPolicy)
		return
	}
	for i, disk := range disks {
		disk.Iothread = fmt.Sprintf("iothread%d", uint32(i)%max(pool, 1))
	}
}

// balloon is the memory balloon, attached unless autoattachMemBalloon is false.
func (b *builder) balloon() *domainv1.Balloon {
	if isFalse(b.vmi.Spec.Domain.Devices.AutoattachMemBalloon) {
		return nil
	}
	return &domainv1.Balloon{}
}

// SEV guest policy bits of the AMD SEV API that the assembler sets.
const (
	sevPolicyNoDebug = 1 << 0 // the guest cannot be debugged: always set, as KubeVirt does
	sevPolicyES      = 1 << 2 // SEV-ES: the register state is encrypted too
)

// launchSecurity is the VMI's memory encryption. AMD SEV needs EFI firmware without secure boot
// (what KubeVirt asks for too: OVMF measures what it launches, and the secure boot variable
// store is not part of the launch measurement).
func (b *builder) launchSecurity() *domainv1.LaunchSecurity {
	ls := b.vmi.Spec.Domain.LaunchSecurity
	if ls == nil || ls.SEV == nil {
		return nil
	}
	const field = fieldDomain + ".launchSecurity.sev"
	var bl *v1alpha1.Bootloader
	if fw := b.vmi.Spec.Domain.Firmware; fw != nil {
		bl = fw.Bootloader
	}
	switch {
	case bl == nil || bl.EFI == nil:
		b.fail(field, "needs EFI firmware (firmware.bootloader.efi with secureBoot: false)")
	case bl.EFI.SecureBoot == nil || *bl.EFI.SecureBoot:
		b.fail(field, "does not work with secure boot: set firmware.bootloader.efi.secureBoot to false")
	}
	if t := b.vmi.Spec.Domain.Devices.UseVirtioTransitional; t != nil && *t {
		b.fail(field, "needs modern-only virtio devices (behind the platform IOMMU): useVirtioTransitional must not be true")
	}
	policy := uint32(sevPolicyNoDebug)
	if p := ls.SEV.Policy; p != nil && p.EncryptedState != nil && *p.EncryptedState {
		policy |= sevPolicyES
	}
	return &domainv1.LaunchSecurity{Sev: &domainv1.SEV{Policy: policy}}
}
