package qmp

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // clock.timezone: the tz database, whether or not the node has one

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// The platform part of the command line: DomainSpec.features and .clock become -machine
// properties (acpi, smm, hpet, pit), -cpu flags (the KVM and Hyper-V ones) and -rtc; inputs,
// the watchdog and the balloon become devices. What only exists under KVM is a host
// precondition when the VM is emulated (needHardware), never dropped.

// hypervFlags maps the domain spec's Hyper-V names to QEMU's -cpu properties.
var hypervFlags = map[string]string{
	"relaxed": "hv-relaxed", "vapic": "hv-vapic", "spinlocks": "hv-spinlocks", "vpindex": "hv-vpindex",
	"runtime": "hv-runtime", "synic": "hv-synic", "stimer": "hv-stimer", "stimer-direct": "hv-stimer-direct",
	"reset": "hv-reset", "vendor-id": "hv-vendor-id", "frequencies": "hv-frequencies",
	"reenlightenment": "hv-reenlightenment", "tlbflush": "hv-tlbflush", "ipi": "hv-ipi", "evmcs": "hv-evmcs",
}

// defaultSpinlockRetries is Hyper-V's spinlock retry count when the spec names none.
const defaultSpinlockRetries = 4096

func onOffProp(name string, t domainv1.Toggle) []string {
	switch t {
	case domainv1.Toggle_TOGGLE_ON:
		return []string{name + "=on"}
	case domainv1.Toggle_TOGGLE_OFF:
		return []string{name + "=off"}
	}
	return nil
}

// machineFeatures are the -machine properties of features and clock: acpi, smm (on for Secure
// Boot, which needs it), hpet and pit.
func (b *argBuilder) machineFeatures() []string {
	f, c := b.spec.GetFeatures(), b.spec.GetClock()
	var opts []string
	if f.GetAcpi() == domainv1.Toggle_TOGGLE_OFF && b.q35 {
		// Measured: without QEMU's tables SeaBIOS makes its own, and the ICH9 chipset's power
		// management is ACPI, so a q35 guest still has ACPI. Only pc can go without.
		b.fail("features.acpi", "a q35 machine always has ACPI (its chipset's power management is ACPI): disabling it needs machine type pc")
	}
	opts = append(opts, onOffProp("acpi", f.GetAcpi())...)
	smm := f.GetSmm()
	if b.spec.GetFirmware().GetEfi().GetSecureBoot() {
		if smm == domainv1.Toggle_TOGGLE_OFF {
			b.fail("features.smm", "Secure Boot (firmware.efi.secureBoot) needs SMM")
		}
		smm = domainv1.Toggle_TOGGLE_ON
	}
	opts = append(opts, onOffProp("smm", smm)...)
	if b.spec.GetFirmware().GetBios().GetUseSerial() {
		// graphics=off has SeaBIOS write to the serial port as well (measured: its banner and
		// "Booting from ..." on ttyS0); the VGA device, if any, keeps working.
		opts = append(opts, "graphics=off")
	}
	opts = append(opts, onOffProp("hpet", c.GetHpet())...)
	opts = append(opts, onOffProp("pit", c.GetPit())...)
	return opts
}

// cpuFeatures are the -cpu properties of cpu.features: on for force, require and optional, off
// for disable and forbid, and "enforce" when one is required, so that QEMU refuses to start
// rather than leave it out (enforce applies to every flag turned on: an optional one beside a
// required one is required too).
func (b *argBuilder) cpuFeatures() []string {
	var flags []string
	enforce := false
	for i, f := range b.spec.GetCpu().GetFeatures() {
		field := fmt.Sprintf("cpu.features[%d]", i)
		if !cpuFlagRE.MatchString(f.GetName()) || (b.env.CPUFlags != nil && !slices.Contains(b.env.CPUFlags, f.GetName())) {
			b.fail(field+".name", "%q is not a CPU feature this QEMU knows", f.GetName())
		}
		switch f.GetPolicy() {
		case "require":
			enforce = true
			flags = append(flags, f.GetName()+"=on")
		case "force", "optional":
			flags = append(flags, f.GetName()+"=on")
		case "disable", "forbid":
			flags = append(flags, f.GetName()+"=off")
		default:
			b.fail(field+".policy", "%q is not supported (force, require, optional, disable or forbid)", f.GetPolicy())
		}
	}
	if enforce {
		flags = append(flags, "enforce")
	}
	return flags
}

var cpuFlagRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// cpuFlags are the -cpu properties of features and clock; each needs KVM.
func (b *argBuilder) cpuFlags() []string {
	f, c := b.spec.GetFeatures(), b.spec.GetClock()
	var flags []string
	if f.GetApicEoi() {
		b.needHardware("features.apicEoi", "paravirtual end of interrupt")
		flags = append(flags, "kvm-pv-eoi=on")
	}
	if f.GetKvmHidden() {
		b.needHardware("features.kvmHidden", "hiding KVM")
		flags = append(flags, "kvm=off")
	}
	switch f.GetPvspinlock() {
	case domainv1.Toggle_TOGGLE_ON:
		b.needHardware("features.pvspinlock", "paravirtual spinlocks")
		flags = append(flags, "kvm-pv-unhalt=on")
	case domainv1.Toggle_TOGGLE_OFF:
		// An emulated VM has no paravirtual spinlocks to turn off.
		if b.env.Accel == AccelKVM {
			flags = append(flags, "kvm-pv-unhalt=off")
		}
	}
	if len(f.GetHyperv()) > 0 {
		b.needHardware("features.hyperv", "Hyper-V enlightenments")
	}
	for _, name := range f.GetHyperv() {
		prop, ok := hypervFlags[name]
		switch {
		case !ok:
			b.fail("features.hyperv", "%q is not a Hyper-V enlightenment this driver knows", name)
		case name == "spinlocks":
			n := f.GetHypervSpinlockRetries()
			if n == 0 {
				n = defaultSpinlockRetries
			}
			flags = append(flags, fmt.Sprintf("%s=0x%x", prop, n))
		case name == "vendor-id":
			v := f.GetHypervVendorId()
			if v == "" || len(v) > 12 || strings.ContainsAny(v, ", ") {
				b.fail("features.hypervVendorId", "%q is not a vendor ID (1 to 12 characters, no comma or space)", v)
			}
			flags = append(flags, prop+"="+v)
		default:
			flags = append(flags, prop+"=on")
		}
	}
	switch c.GetKvm() {
	case domainv1.Toggle_TOGGLE_ON:
		b.needHardware("clock.kvm", "the KVM clock")
		flags = append(flags, "kvmclock=on")
	case domainv1.Toggle_TOGGLE_OFF:
		// An emulated VM has no KVM clock to remove.
		if b.env.Accel == AccelKVM {
			flags = append(flags, "kvmclock=off")
		}
	}
	if c.GetHyperv() == domainv1.Toggle_TOGGLE_ON {
		b.needHardware("clock.hyperv", "the Hyper-V reference time counter")
		flags = append(flags, "hv-time=on")
	}
	return flags
}

// rtc is -rtc: where the clock starts (UTC, UTC plus an offset, or a zone's local time, worked
// out now, as the VM starts), what it tracks and how late ticks are made up; and the PIT's
// tick policy, which only the in-kernel PIT has.
func (b *argBuilder) rtc() {
	c := b.spec.GetClock()
	if c == nil {
		return
	}
	now := time.Now
	if b.env.Now != nil {
		now = b.env.Now
	}
	var opts []string
	switch {
	case c.GetTimezone() != "":
		loc, err := time.LoadLocation(c.GetTimezone())
		if err != nil {
			b.fail("clock.timezone", "%q is not a time zone: %v", c.GetTimezone(), err)
			break
		}
		opts = append(opts, "base="+now().In(loc).Format("2006-01-02T15:04:05"))
	case c.GetUtcOffsetSeconds() != 0:
		opts = append(opts, "base="+now().UTC().Add(time.Duration(c.GetUtcOffsetSeconds())*time.Second).Format("2006-01-02T15:04:05"))
	}
	switch c.GetRtcTrack() {
	case "":
	case "guest":
		opts = append(opts, "clock=vm")
	case "wall":
		opts = append(opts, "clock=host")
	default:
		b.fail("clock.rtcTrack", "%q is not supported (guest or wall)", c.GetRtcTrack())
	}
	switch c.GetRtcTickPolicy() {
	case "":
	case "delay":
		opts = append(opts, "driftfix=none")
	case "catchup":
		opts = append(opts, "driftfix=slew")
	default:
		b.fail("clock.rtcTickPolicy", "%q is not supported (delay or catchup)", c.GetRtcTickPolicy())
	}
	if len(opts) > 0 {
		b.add("-rtc", strings.Join(opts, ","))
	}
	switch p := c.GetPitTickPolicy(); p {
	case "":
	case "delay", "discard":
		b.needHardware("clock.pitTickPolicy", "a PIT tick policy (the in-kernel PIT)")
		b.add("-global", "kvm-pit.lost_tick_policy="+p)
	default:
		b.fail("clock.pitTickPolicy", "%q is not supported (delay or discard)", p)
	}
}

// inputDevices are QEMU's devices for each input type and bus. The virtio ones are modern
// only (virtio 1.0 devices, which have no legacy interface), whatever virtio_transitional says.
var inputDevices = map[[2]string]string{
	{"tablet", "usb"}: "usb-tablet", {"keyboard", "usb"}: "usb-kbd",
	{"tablet", "virtio"}: "virtio-tablet-pci", {"keyboard", "virtio"}: "virtio-keyboard-pci",
}

func (b *argBuilder) inputs() {
	for i, in := range b.spec.GetInputs() {
		dev, ok := inputDevices[[2]string{in.GetType(), in.GetBus()}]
		if !ok {
			b.fail(fmt.Sprintf("inputs[%d]", i), "a %q on bus %q is not supported (tablet or keyboard, on usb or virtio)", in.GetType(), in.GetBus())
			continue
		}
		opts := []string{dev, fmt.Sprintf("id=input%d", i)}
		if in.GetBus() == "usb" {
			b.usbController()
			opts = append(opts, "bus=usb0.0")
		}
		b.add("-device", strings.Join(opts, ","))
	}
}

// watchdogActions are QEMU's -action watchdog= values: poweroff stops at once, shutdown
// presses the ACPI power button.
var watchdogActions = map[string]string{"poweroff": "poweroff", "reset": "reset", "shutdown": "shutdown"}

// soundDevices are QEMU's devices for each sound model; the audio goes to a "none" backend.
var soundDevices = map[string][]string{
	"ich9": {"-device", "ich9-intel-hda,id=sound0", "-device", "hda-duplex,id=sound0-codec0,bus=sound0.0,audiodev=audio0"},
	"ac97": {"-device", "AC97,id=sound0,audiodev=audio0"},
}

func (b *argBuilder) sound() {
	s := b.spec.GetSound()
	if s == nil {
		return
	}
	dev, ok := soundDevices[s.GetModel()]
	if !ok {
		b.fail("sound.model", "%q is not supported (ich9 or ac97)", s.GetModel())
		return
	}
	b.add("-audiodev", "none,id=audio0")
	b.add(dev...)
}

func (b *argBuilder) watchdog() {
	w := b.spec.GetWatchdog()
	if w == nil {
		return
	}
	if m := w.GetModel(); m != "i6300esb" {
		b.fail("watchdog.model", "%q is not supported (i6300esb)", m)
	}
	action, ok := watchdogActions[w.GetAction()]
	if !ok {
		b.fail("watchdog.action", "%q is not supported (poweroff, reset or shutdown)", w.GetAction())
	}
	b.add("-device", "i6300esb,id=watchdog0", "-action", "watchdog="+action)
}
