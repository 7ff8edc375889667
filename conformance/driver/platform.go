package conformance

import (
	"math"
	"strconv"
	"strings"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// PCI IDs (vendor:device) the platform checks look for in Guest.PCIMarker's line.
const (
	pciI6300ESB = "8086:25ab"
	// A virtio balloon is 1af4:1045, modern only (virtio 1.0), or 1af4:1002 as a transitional
	// device (legacy and modern).
	pciBalloon, pciBalloonTransitional = "1af4:1045", "1af4:1002"
	pciVirtioInput                     = "1af4:1052"
	pciICH9HDA                         = "8086:293e"
)

// clockZone is the zone Clock/Start asks for: its offset (+05:30) has no daylight saving time,
// so it is the same whenever the check runs.
const (
	clockZone       = "Asia/Kolkata"
	clockZoneOffset = 5*time.Hour + 30*time.Minute
	// clockSlack is how far the guest's clock may be from where it should be: the guest reads
	// it some seconds before it is ready, and a driver works the start out when it starts the VM.
	clockSlack = 2 * time.Minute
)

// checkDevicesWatchdog: a VM whose domain spec has an i6300esb watchdog boots a guest that
// finds it on its PCI bus (Guest.PCIMarker's line).
func (s *vmSuite) checkDevicesWatchdog(t T) {
	s.requireDevice(t, driver.DeviceWatchdog, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) {
		spec.Watchdog = &domainv1.Watchdog{Name: "watchdog", Model: "i6300esb", Action: "reset"}
	})
	if ids := s.pciIDs(t, vm); countField(ids, pciI6300ESB) == 0 {
		t.Errorf("the guest's PCI devices are %q: no i6300esb (%s), though the domain spec asked for one", ids, pciI6300ESB)
	}
}

// checkDevicesBalloon: a VM whose domain spec has a memory balloon boots a guest that finds a
// virtio balloon on its PCI bus, modern only as every virtio device without virtio_transitional.
func (s *vmSuite) checkDevicesBalloon(t T) {
	s.requireDevice(t, driver.DeviceBalloon, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Balloon = &domainv1.Balloon{} })
	switch ids := s.pciIDs(t, vm); {
	case countField(ids, pciBalloonTransitional) > 0:
		t.Errorf("the guest's PCI devices are %q: a transitional virtio balloon (%s), though the domain spec's virtio_transitional is false: without it virtio devices are modern only (%s)",
			ids, pciBalloonTransitional, pciBalloon)
	case countField(ids, pciBalloon) == 0:
		t.Errorf("the guest's PCI devices are %q: no virtio balloon (%s), though the domain spec asked for one", ids, pciBalloon)
	}
}

// checkDevicesVirtioTransitional: a VM whose domain spec has virtio_transitional and a memory
// balloon boots a guest that finds a transitional virtio balloon (legacy and modern).
func (s *vmSuite) checkDevicesVirtioTransitional(t T) {
	s.requireDevice(t, driver.DeviceBalloon, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	s.requireDevice(t, driver.DeviceVirtioTransitional, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Balloon, spec.VirtioTransitional = &domainv1.Balloon{}, true })
	if ids := s.pciIDs(t, vm); countField(ids, pciBalloonTransitional) == 0 {
		t.Errorf("the guest's PCI devices are %q: no transitional virtio balloon (%s), though the domain spec's virtio_transitional asked for transitional virtio devices", ids, pciBalloonTransitional)
	}
}

// checkDevicesSound: a VM whose domain spec has an ich9 sound card boots a guest that finds an
// Intel HD Audio controller on its PCI bus.
func (s *vmSuite) checkDevicesSound(t T) {
	s.requireDevice(t, driver.DeviceSound, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Sound = &domainv1.Sound{Name: "sound", Model: "ich9"} })
	if ids := s.pciIDs(t, vm); countField(ids, pciICH9HDA) == 0 {
		t.Errorf("the guest's PCI devices are %q: no Intel HD Audio controller (%s), though the domain spec asked for an ich9 sound card", ids, pciICH9HDA)
	}
}

// checkDevicesInput: a VM whose domain spec has a virtio tablet and a virtio keyboard boots a
// guest with two virtio input devices on its PCI bus, and a tablet among the input devices its
// kernel registered (Guest.InputMarker's lines).
func (s *vmSuite) checkDevicesInput(t T) {
	s.requireDevice(t, driver.DeviceInput, s.guest.PCIMarker, "the guest does not list its PCI devices (Guest.PCIMarker)")
	s.requireDevice(t, driver.DeviceInput, s.guest.InputMarker, "the guest does not list its input devices (Guest.InputMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) {
		spec.Inputs = []*domainv1.Input{{Name: "tablet", Type: "tablet", Bus: "virtio"}, {Name: "keyboard", Type: "keyboard", Bus: "virtio"}}
	})
	if ids := s.pciIDs(t, vm); countField(ids, pciVirtioInput) != 2 {
		t.Errorf("the guest's PCI devices are %q: want two virtio input devices (%s), a tablet and a keyboard", ids, pciVirtioInput)
	}
	names := markerLines(vm.console.out.String(), s.guest.InputMarker)
	tablet := false
	for _, n := range names {
		tablet = tablet || strings.Contains(strings.ToLower(n), "tablet")
	}
	if !tablet {
		t.Errorf("the guest's input devices are %q: no tablet, though the domain spec asked for one", names)
	}
}

// checkClockStart: a VM whose domain spec starts its clock in a time zone (+05:30) boots a guest
// whose real-time clock, read as UTC, is that far ahead of UTC (Guest.ClockMarker's rtc=).
func (s *vmSuite) checkClockStart(t T) {
	s.requireDevice(t, driver.DeviceClock, s.guest.ClockMarker, "the guest does not print its real-time clock (Guest.ClockMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Clock = &domainv1.Clock{Timezone: clockZone} })
	now := time.Now()
	lines := markerLines(vm.console.out.String(), s.guest.ClockMarker)
	if len(lines) == 0 {
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.ClockMarker, vm.console.out.Tail())
	}
	var rtc int64 = math.MinInt64
	for _, f := range strings.Fields(lines[len(lines)-1]) {
		if v, ok := strings.CutPrefix(f, "rtc="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				rtc = n
			}
		}
	}
	if rtc == math.MinInt64 {
		t.Fatalf("the guest's clock line %q has no rtc=<seconds>", lines[len(lines)-1])
	}
	ahead := time.Unix(rtc, 0).Sub(now)
	if d := ahead - clockZoneOffset; d < -clockSlack || d > clockSlack {
		t.Errorf("the guest's clock is %v ahead of UTC, want %v (%s), within %v", ahead.Round(time.Second), clockZoneOffset, clockZone, clockSlack)
	}
}

// The CPU features CPU/Features asks for: aes off and popcnt required, by names the kernel
// shares with QEMU. Every x86-64 CPU model since Nehalem has both (and QEMU's TCG emulates them).
const forbiddenCPUFlag, requiredCPUFlag = "aes", "popcnt"

// checkCPUFeatures: a VM whose domain spec forbids one CPU feature and requires another boots a
// guest whose CPU has the one and not the other (Guest.CPUFlagsMarker's line).
func (s *vmSuite) checkCPUFeatures(t T) {
	s.requireDevice(t, driver.DeviceCPUFeatures, s.guest.CPUFlagsMarker, "the guest does not print its CPU flags (Guest.CPUFlagsMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) {
		if spec.Cpu == nil {
			spec.Cpu = &domainv1.CPU{}
		}
		spec.Cpu.Features = []*domainv1.CPUFeature{{Name: forbiddenCPUFlag, Policy: "forbid"}, {Name: requiredCPUFlag, Policy: "require"}}
	})
	lines := markerLines(vm.console.out.String(), s.guest.CPUFlagsMarker)
	if len(lines) == 0 {
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.CPUFlagsMarker, vm.console.out.Tail())
	}
	flags := lines[len(lines)-1]
	if countField(flags, forbiddenCPUFlag) > 0 {
		t.Errorf("the guest's CPU has %q, which the domain spec forbids (flags: %s)", forbiddenCPUFlag, flags)
	}
	if countField(flags, requiredCPUFlag) == 0 {
		t.Errorf("the guest's CPU lacks %q, which the domain spec requires (flags: %s)", requiredCPUFlag, flags)
	}
}

// pciIDs is the guest's PCI device list (Guest.PCIMarker's last line); it fails t without one.
func (s *vmSuite) pciIDs(t T, vm *guestVM) string {
	t.Helper()
	lines := markerLines(vm.console.out.String(), s.guest.PCIMarker)
	if len(lines) == 0 {
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.PCIMarker, vm.console.out.Tail())
	}
	return lines[len(lines)-1]
}

// countField is how many of the space-separated fields of s are f.
func countField(s, f string) int {
	n := 0
	for _, x := range strings.Fields(s) {
		if x == f {
			n++
		}
	}
	return n
}
