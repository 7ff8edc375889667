package libvirt

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // clock.timezone: the tz database, whether or not the node has one

	"libvirt.org/go/libvirtxml"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// The platform part of the domain: DomainSpec.features, .clock, .inputs, .watchdog, .sound,
// .chassis and cpu.features in libvirt's terms, with the qmp driver's meaning. What only exists
// under KVM is a host precondition when the VM is emulated (needHardware), never dropped.

// needHardware records that field needs hardware virtualisation when the VM is emulated: a
// host precondition (FailedPrecondition), as the VMI may run on a node with KVM.
func (b *builder) needHardware(field, what string) {
	if b.env.Accel != qmp.AccelKVM && b.missing == "" {
		b.missing = fmt.Sprintf("%s: %s needs hardware virtualisation (KVM), but this VM is emulated (%s)", field, what, b.env.Accel)
	}
}

func state(on bool) *libvirtxml.DomainFeatureState {
	return &libvirtxml.DomainFeatureState{State: map[bool]string{true: "on", false: "off"}[on]}
}

// toggleState is a Toggle as libvirt's state attribute; nil for the default.
func toggleState(t domainv1.Toggle) *libvirtxml.DomainFeatureState {
	switch t {
	case domainv1.Toggle_TOGGLE_ON:
		return state(true)
	case domainv1.Toggle_TOGGLE_OFF:
		return state(false)
	}
	return nil
}

// togglePresent is a Toggle as a timer's present attribute; "" for the default.
func togglePresent(t domainv1.Toggle) string {
	switch t {
	case domainv1.Toggle_TOGGLE_ON:
		return "yes"
	case domainv1.Toggle_TOGGLE_OFF:
		return "no"
	}
	return ""
}

// features maps DomainSpec.features onto <features>: acpi, smm (on for Secure Boot, set by
// firmware), the APIC's paravirtual EOI, KVM hidden, pvspinlock and the Hyper-V enlightenments.
func (b *builder) features(d *libvirtxml.Domain) {
	f := b.spec.GetFeatures()
	if f == nil {
		return
	}
	fl := d.Features
	switch f.GetAcpi() {
	case domainv1.Toggle_TOGGLE_OFF:
		if d.OS.Type.Machine != "pc" && !isI440FX(d.OS.Type.Machine) {
			// As measured under qmp: the ICH9 chipset's power management is ACPI.
			b.fail("features.acpi", "a q35 machine always has ACPI (its chipset's power management is ACPI): disabling it needs machine type pc")
		}
		fl.ACPI = nil
	}
	if s := toggleState(f.GetSmm()); s != nil {
		if s.State == "off" && b.spec.GetFirmware().GetEfi().GetSecureBoot() {
			b.fail("features.smm", "Secure Boot (firmware.efi.secureBoot) needs SMM")
		} else if fl.SMM == nil {
			fl.SMM = &libvirtxml.DomainFeatureSMM{State: s.State}
		}
	}
	if f.GetApicEoi() {
		b.needHardware("features.apicEoi", "paravirtual end of interrupt")
		fl.APIC.EOI = "on"
	}
	if f.GetKvmHidden() {
		b.needHardware("features.kvmHidden", "hiding KVM")
		fl.KVM = &libvirtxml.DomainFeatureKVM{Hidden: state(true)}
	}
	switch f.GetPvspinlock() {
	case domainv1.Toggle_TOGGLE_ON:
		b.needHardware("features.pvspinlock", "paravirtual spinlocks")
		fl.PVSpinlock = state(true)
	case domainv1.Toggle_TOGGLE_OFF:
		// An emulated VM has no paravirtual spinlocks to turn off.
		if b.env.Accel == qmp.AccelKVM {
			fl.PVSpinlock = state(false)
		}
	}
	if len(f.GetHyperv()) > 0 {
		b.needHardware("features.hyperv", "Hyper-V enlightenments")
		fl.HyperV = b.hyperv(f)
	}
}

func isI440FX(m string) bool { return strings.HasPrefix(m, "pc-i440fx-") }

// hyperv is <hyperv mode='custom'> with the enlightenments named.
func (b *builder) hyperv(f *domainv1.Features) *libvirtxml.DomainFeatureHyperV {
	h := &libvirtxml.DomainFeatureHyperV{Mode: "custom"}
	on := state(true)
	for _, name := range f.GetHyperv() {
		switch name {
		case "relaxed":
			h.Relaxed = on
		case "vapic":
			h.VAPIC = on
		case "spinlocks":
			n := f.GetHypervSpinlockRetries()
			if n == 0 {
				n = 4096
			}
			if n < 4096 {
				b.fail("features.hypervSpinlockRetries", "%d is below 4096", n)
			}
			h.Spinlocks = &libvirtxml.DomainFeatureHyperVSpinlocks{DomainFeatureState: *on, Retries: uint(n)}
		case "vpindex":
			h.VPIndex = on
		case "runtime":
			h.Runtime = on
		case "synic":
			h.Synic = on
		case "stimer":
			if h.STimer == nil {
				h.STimer = &libvirtxml.DomainFeatureHyperVSTimer{DomainFeatureState: *on}
			}
		case "stimer-direct":
			h.STimer = &libvirtxml.DomainFeatureHyperVSTimer{DomainFeatureState: *on, Direct: on}
		case "reset":
			h.Reset = on
		case "vendor-id":
			v := f.GetHypervVendorId()
			if v == "" || len(v) > 12 || !vendorIDRE.MatchString(v) {
				b.fail("features.hypervVendorId", "%q is not a vendor ID (1 to 12 characters, no comma or space)", v)
			}
			h.VendorId = &libvirtxml.DomainFeatureHyperVVendorId{DomainFeatureState: *on, Value: v}
		case "frequencies":
			h.Frequencies = on
		case "reenlightenment":
			h.ReEnlightenment = on
		case "tlbflush":
			h.TLBFlush = &libvirtxml.DomainFeatureHyperVTLBFlush{DomainFeatureState: *on}
		case "ipi":
			h.IPI = on
		case "evmcs":
			h.EVMCS = on
		default:
			b.fail("features.hyperv", "%q is not a Hyper-V enlightenment this driver knows", name)
		}
	}
	return h
}

var vendorIDRE = regexp.MustCompile(`^[^, ]+$`)

// clock is <clock>: where it starts (UTC, UTC plus an offset, or a zone's local time, worked
// out now, as the VM starts: a fixed adjustment from UTC, so that QEMU needs no zone data) and
// its timers.
func (b *builder) clock(d *libvirtxml.Domain) {
	c := b.spec.GetClock()
	if c == nil {
		return
	}
	now := time.Now
	if b.env.Now != nil {
		now = b.env.Now
	}
	x := &libvirtxml.DomainClock{Offset: "utc"}
	var offset int64
	switch {
	case c.GetTimezone() != "":
		loc, err := time.LoadLocation(c.GetTimezone())
		if err != nil {
			b.fail("clock.timezone", "%q is not a time zone: %v", c.GetTimezone(), err)
			break
		}
		_, off := now().In(loc).Zone()
		offset = int64(off)
	default:
		offset = c.GetUtcOffsetSeconds()
	}
	if offset != 0 {
		x.Offset, x.Basis, x.Adjustment = "variable", "utc", strconv.FormatInt(offset, 10)
	}
	if p := togglePresent(c.GetHpet()); p != "" {
		x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: "hpet", Present: p})
	}
	pit := libvirtxml.DomainTimer{Name: "pit", Present: togglePresent(c.GetPit())}
	switch p := c.GetPitTickPolicy(); p {
	case "":
	case "delay", "discard":
		b.needHardware("clock.pitTickPolicy", "a PIT tick policy (the in-kernel PIT)")
		pit.TickPolicy = p
	default:
		b.fail("clock.pitTickPolicy", "%q is not supported (delay or discard)", p)
	}
	if pit.Present != "" || pit.TickPolicy != "" {
		x.Timer = append(x.Timer, pit)
	}
	rtc := libvirtxml.DomainTimer{Name: "rtc"}
	switch t := c.GetRtcTrack(); t {
	case "", "guest", "wall":
		rtc.Track = t
	default:
		b.fail("clock.rtcTrack", "%q is not supported (guest or wall)", t)
	}
	switch p := c.GetRtcTickPolicy(); p {
	case "", "delay", "catchup":
		rtc.TickPolicy = p
	default:
		b.fail("clock.rtcTickPolicy", "%q is not supported (delay or catchup)", p)
	}
	if rtc.Track != "" || rtc.TickPolicy != "" {
		x.Timer = append(x.Timer, rtc)
	}
	switch c.GetKvm() {
	case domainv1.Toggle_TOGGLE_ON:
		b.needHardware("clock.kvm", "the KVM clock")
		x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: "kvmclock", Present: "yes"})
	case domainv1.Toggle_TOGGLE_OFF:
		// An emulated VM has no KVM clock to remove.
		if b.env.Accel == qmp.AccelKVM {
			x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: "kvmclock", Present: "no"})
		}
	}
	switch c.GetHyperv() {
	case domainv1.Toggle_TOGGLE_ON:
		b.needHardware("clock.hyperv", "the Hyper-V reference time counter")
		x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: "hypervclock", Present: "yes"})
	case domainv1.Toggle_TOGGLE_OFF:
		if b.env.Accel == qmp.AccelKVM {
			x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: "hypervclock", Present: "no"})
		}
	}
	d.Clock = x
}

// cpuFeatures are cpu.features as <feature policy=...>: libvirt's policies are the spec's.
// libvirt wants a model beside features: without one it is the default, qemu64.
func (b *builder) cpuFeatures(cpu *libvirtxml.DomainCPU) {
	fs := b.spec.GetCpu().GetFeatures()
	for i, f := range fs {
		field := fmt.Sprintf("cpu.features[%d]", i)
		if !cpuFlagRE.MatchString(f.GetName()) {
			b.fail(field+".name", "%q is not a CPU feature name", f.GetName())
		}
		switch f.GetPolicy() {
		case "require", "force", "optional", "disable", "forbid":
		default:
			b.fail(field+".policy", "%q is not supported (force, require, optional, disable or forbid)", f.GetPolicy())
		}
		cpu.Features = append(cpu.Features, libvirtxml.DomainCPUFeature{Policy: f.GetPolicy(), Name: f.GetName()})
		b.org.add("cpu/feature["+f.GetName()+"]", field+".name", f.GetName())
		b.org.add("cpu/feature["+f.GetName()+"]@policy", field+".policy", f.GetPolicy())
	}
	if len(fs) > 0 && cpu.Mode == "" {
		cpu.Mode, cpu.Match = "custom", "exact"
		cpu.Model = &libvirtxml.DomainCPUModel{Value: "qemu64", Fallback: "forbid"}
		b.org.add("cpu/model", "cpu.features", "qemu64") // the model libvirt needs beside them
	}
}

var cpuFlagRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// inputs are tablets and keyboards, on virtio (modern only by their nature) or USB (an xHCI
// controller, added for them).
func (b *builder) inputs(d *libvirtxml.Domain) (usb bool) {
	for i, in := range b.spec.GetInputs() {
		okType := in.GetType() == "tablet" || in.GetType() == "keyboard"
		okBus := in.GetBus() == "usb" || in.GetBus() == "virtio"
		if !okType || !okBus {
			b.fail(fmt.Sprintf("inputs[%d]", i), "a %q on bus %q is not supported (tablet or keyboard, on usb or virtio)", in.GetType(), in.GetBus())
			continue
		}
		usb = usb || in.GetBus() == "usb"
		a := "ua-input-" + alias(in.GetName())
		d.Devices.Inputs = append(d.Devices.Inputs, libvirtxml.DomainInput{
			Type: in.GetType(), Bus: in.GetBus(), Alias: &libvirtxml.DomainAlias{Name: a},
		})
		b.org.device("devices/input["+a+"]", fmt.Sprintf("inputs[%d]", i), fmt.Sprintf("input %q", in.GetName()), a)
	}
	return usb
}

// watchdog is an i6300esb; libvirt's actions are the spec's (shutdown presses the power button).
func (b *builder) watchdog(d *libvirtxml.Domain) {
	w := b.spec.GetWatchdog()
	if w == nil {
		return
	}
	if m := w.GetModel(); m != "i6300esb" {
		b.fail("watchdog.model", "%q is not supported (i6300esb)", m)
	}
	switch w.GetAction() {
	case "poweroff", "reset", "shutdown":
	default:
		b.fail("watchdog.action", "%q is not supported (poweroff, reset or shutdown)", w.GetAction())
	}
	d.Devices.Watchdogs = append(d.Devices.Watchdogs, libvirtxml.DomainWatchdog{Model: "i6300esb", Action: w.GetAction()})
	b.org.add("devices/watchdog", "watchdog", "")
}

// sound is an ich9 (Intel HD Audio) or ac97 card whose audio goes nowhere (an audio backend
// of type none: session libvirt would otherwise pick one of the user's sound servers).
func (b *builder) sound(d *libvirtxml.Domain) {
	s := b.spec.GetSound()
	if s == nil {
		return
	}
	if m := s.GetModel(); m != "ich9" && m != "ac97" {
		b.fail("sound.model", "%q is not supported (ich9 or ac97)", m)
		return
	}
	d.Devices.Audios = append(d.Devices.Audios, libvirtxml.DomainAudio{ID: 1, None: &libvirtxml.DomainAudioNone{}})
	d.Devices.Sounds = append(d.Devices.Sounds, libvirtxml.DomainSound{Model: s.GetModel(), Audio: &libvirtxml.DomainSoundAudio{ID: 1}})
	b.org.add("devices/sound", "sound.model", s.GetModel())
}

// chassis is SMBIOS type 3, beside the system entries in the same <sysinfo>.
func (b *builder) chassis(d *libvirtxml.Domain) {
	c := b.spec.GetChassis()
	if c == nil {
		return
	}
	var e []libvirtxml.DomainSysInfoEntry
	for _, kv := range []struct{ k, v string }{{"manufacturer", c.GetManufacturer()}, {"version", c.GetVersion()}, {"serial", c.GetSerial()}, {"asset", c.GetAsset()}, {"sku", c.GetSku()}} {
		if kv.v != "" {
			e = append(e, libvirtxml.DomainSysInfoEntry{Name: kv.k, Value: kv.v})
		}
	}
	if len(e) == 0 {
		return
	}
	if len(d.SysInfo) == 0 {
		d.SysInfo = []libvirtxml.DomainSysInfo{{SMBIOS: &libvirtxml.DomainSysInfoSMBIOS{}}}
		d.OS.SMBios = &libvirtxml.DomainSMBios{Mode: "sysinfo"}
	}
	d.SysInfo[0].SMBIOS.Chassis = &libvirtxml.DomainSysInfoChassis{Entry: e}
}

// pinning is cpu.pinning as <cputune>: a vcpupin per vCPU, and an emulatorpin for the VM
// process's other threads. libvirt starts QEMU with the emulator's CPUs as its affinity (the
// process's threads inherit it) and, its vCPUs stopped, pins each vCPU's thread (in session
// mode by sched_setaffinity, without cgroups) before it lets the guest run. Without emulator
// CPUs the other threads keep the CPUs the process started with. The spec's pinning was checked
// by domain.Validate (one distinct CPU per vCPU, disjoint from the emulator's).
func (b *builder) pinning(d *libvirtxml.Domain) {
	p := b.spec.GetCpu().GetPinning()
	if p == nil {
		return
	}
	t := &libvirtxml.DomainCPUTune{}
	b.org.add("cputune", "cpu.pinning", "")
	for i, c := range p.GetVcpuHostCpus() {
		t.VCPUPin = append(t.VCPUPin, libvirtxml.DomainCPUTuneVCPUPin{VCPU: uint(i), CPUSet: strconv.FormatUint(uint64(c), 10)})
		b.org.add(fmt.Sprintf("cputune/vcpupin[%d]", i), fmt.Sprintf("cpu.pinning.vcpuHostCpus[%d]", i), strconv.FormatUint(uint64(c), 10))
	}
	if e := p.GetEmulatorHostCpus(); len(e) > 0 {
		set := make([]string, len(e))
		for i, c := range e {
			set[i] = strconv.FormatUint(uint64(c), 10)
		}
		t.EmulatorPin = &libvirtxml.DomainCPUTuneEmulatorPin{CPUSet: strings.Join(set, ",")}
		b.org.add("cputune/emulatorpin", "cpu.pinning.emulatorHostCpus", t.EmulatorPin.CPUSet)
	}
	d.CPUTune = t
}

// errorPolicies are libvirt's error_policy and rerror_policy of each spec error policy, as the
// qmp driver's werror and rerror: enospace stops on a full host disk only, and reports read
// errors.
var errorPolicies = map[string][2]string{
	"stop": {"stop", "stop"}, "report": {"report", "report"}, "ignore": {"ignore", "ignore"}, "enospace": {"enospace", "report"},
}

var iothreadRE = regexp.MustCompile(`^iothread[0-9]+$`)

// diskOptions are a disk's options (the "disk-options" device): its I/O mode, I/O thread (its
// own or a pool one, virtio only), queues (virtio only), block sizes, shared writing and error
// policy.
func (b *builder) diskOptions(f string, disk *domainv1.Disk, bus domainv1.DiskBus, x *libvirtxml.DomainDisk) {
	virtio := bus == domainv1.DiskBus_DISK_BUS_VIRTIO
	switch disk.GetIo() {
	case "":
	case "native":
		if disk.GetCache() != "none" {
			b.fail(f+".io", "native needs cache none")
		}
		x.Driver.IO = "native"
	case "threads":
		x.Driver.IO = "threads"
	default:
		b.fail(f+".io", "%q is not supported (native or threads)", disk.GetIo())
	}
	if q := disk.GetQueues(); q > 0 {
		if !virtio {
			b.fail(f+".queues", "only a virtio disk has queues")
		}
		n := uint(q)
		x.Driver.Queues = &n
	}
	name := disk.GetIothread()
	if disk.GetDedicatedIothread() {
		name = "disk:" + disk.GetName() // a thread of its own, whatever iothread says
	} else if name != "" && !iothreadRE.MatchString(name) {
		b.fail(f+".iothread", "%q is not an I/O thread name (iothread<n>)", name)
	}
	if name != "" {
		if !virtio {
			b.fail(f+".iothread", "only a virtio disk has an I/O thread")
		}
		if b.iothreads == nil {
			b.iothreads = map[string]uint{}
		}
		id, ok := b.iothreads[name]
		if !ok {
			id = uint(len(b.iothreads) + 1)
			b.iothreads[name] = id
		}
		x.Driver.IOThread = &id
	}
	for _, bs := range []struct {
		field string
		n     uint32
	}{{"logicalBlockSize", disk.GetLogicalBlockSize()}, {"physicalBlockSize", disk.GetPhysicalBlockSize()}} {
		if bs.n != 0 && (bs.n < 512 || bs.n > 65536 || bs.n&(bs.n-1) != 0) {
			b.fail(f+"."+bs.field, "%d is not a power of two from 512 to 65536", bs.n)
		}
	}
	if l, p := disk.GetLogicalBlockSize(), disk.GetPhysicalBlockSize(); l != 0 || p != 0 {
		x.BlockIO = &libvirtxml.DomainDiskBlockIO{LogicalBlockSize: uint(l), PhysicalBlockSize: uint(p)}
	}
	if disk.GetShareable() {
		// Other VMs may write the image at the same time (QEMU's share-rw).
		x.Shareable = &libvirtxml.DomainDiskShareable{}
	}
	if p := disk.GetErrorPolicy(); p != "" {
		e, ok := errorPolicies[p]
		if !ok {
			b.fail(f+".errorPolicy", "%q is not supported (stop, report, ignore or enospace)", p)
		}
		if disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_CDROM {
			b.fail(f+".errorPolicy", "a cdrom has no error policy")
		}
		x.Driver.ErrorPolicy, x.Driver.RErrorPolicy = e[0], e[1]
	}
}

// numa is cpu.numaCells as <cpu><numa>: cell i is guest node i with its vCPUs and memory, and
// a cell's host nodes a <numatune> memnode in strict mode (QEMU's memory backend of the cell
// with policy bind: the start fails rather than take memory elsewhere). domain.Validate checked
// the cells (every vCPU in one, the memory adding up).
func (b *builder) numa(cpu *libvirtxml.DomainCPU, d *libvirtxml.Domain) {
	cells := b.spec.GetCpu().GetNumaCells()
	if len(cells) == 0 {
		return
	}
	n := &libvirtxml.DomainNuma{}
	var tune libvirtxml.DomainNUMATune
	for i, c := range cells {
		if c.GetMemoryBytes()%(1<<10) != 0 {
			b.fail(fmt.Sprintf("cpu.numaCells[%d].memoryBytes", i), "%d is not a multiple of 1 KiB", c.GetMemoryBytes())
		}
		id := uint(i)
		n.Cell = append(n.Cell, libvirtxml.DomainCell{ID: &id, CPUs: uintList(c.GetVcpus()), Memory: uint(c.GetMemoryBytes() >> 10), Unit: "KiB"})
		b.org.add(fmt.Sprintf("cpu/numa/cell[%d]", i), fmt.Sprintf("cpu.numaCells[%d]", i), "")
		if hn := c.GetHostNodes(); len(hn) > 0 {
			tune.MemNodes = append(tune.MemNodes, libvirtxml.DomainNUMATuneMemNode{CellID: id, Mode: "strict", Nodeset: uintList(hn)})
			b.org.add(fmt.Sprintf("numatune/memnode[%d]@nodeset", i), fmt.Sprintf("cpu.numaCells[%d].hostNodes", i), uintList(hn))
		}
	}
	cpu.Numa = n
	if len(tune.MemNodes) > 0 {
		d.NUMATune = &tune
	}
}

// uintList is libvirt's list syntax for numbers: "0,2,3".
func uintList(ns []uint32) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.FormatUint(uint64(n), 10)
	}
	return strings.Join(s, ",")
}
