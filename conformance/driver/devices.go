package conformance

import (
	"slices"
	"strings"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// checkDevicesRNG: a VM whose domain spec asks for a virtio entropy device (rng) boots a guest
// whose kernel lists a virtio RNG among its hardware RNGs (Guest.RNGMarker's line).
func (s *vmSuite) checkDevicesRNG(t T) {
	s.requireDevice(t, driver.DeviceRNG, s.guest.RNGMarker, "the guest lists no hardware RNGs (Guest.RNGMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Rng = &domainv1.RNG{} })
	lines := markerLines(vm.console.out.String(), s.guest.RNGMarker)
	line := strings.Join(lines, " ")
	switch {
	case len(lines) == 0:
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.RNGMarker, vm.console.out.Tail())
	case !strings.Contains(line, "virtio"):
		t.Errorf("the guest's hardware RNGs are %q: no virtio RNG, though the domain spec asked for one", line)
	}
}

// checkDevicesChassis: a VM whose domain spec has SMBIOS chassis information boots a guest that
// reads it back (Guest.DMIMarker's lines: chassis_vendor, chassis_version, chassis_serial,
// chassis_asset_tag), a comma in a value included.
func (s *vmSuite) checkDevicesChassis(t T) {
	s.requireDevice(t, driver.DeviceChassis, s.guest.DMIMarker, "the guest prints no SMBIOS strings (Guest.DMIMarker)")
	serial := "kit-" + strings.ReplaceAll(newID(), "-", "")[:12]
	ch := &domainv1.Chassis{Manufacturer: "Kubevisor, conformance", Version: "v1", Serial: serial, Asset: "asset-42", Sku: "sku-7"}
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Chassis = ch })
	seen := map[string]string{}
	for _, l := range markerLines(vm.console.out.String(), s.guest.DMIMarker) {
		if k, v, ok := strings.Cut(l, "="); ok {
			seen[k] = v
		}
	}
	for k, want := range map[string]string{"chassis_vendor": ch.GetManufacturer(), "chassis_version": ch.GetVersion(), "chassis_serial": ch.GetSerial(), "chassis_asset_tag": ch.GetAsset()} {
		if got, ok := seen[k]; !ok || got != want {
			t.Errorf("the guest reads %s = %q (printed: %v), want %q from the domain spec's chassis", k, got, ok, want)
		}
	}
}

// checkDevicesTPM: a VM whose domain spec has a TPM boots a guest whose kernel finds a TPM 2.0
// (Guest.TPMMarker's line: a device with version=2).
func (s *vmSuite) checkDevicesTPM(t T) {
	s.requireDevice(t, driver.DeviceTPM, s.guest.TPMMarker, "the guest does not print its TPM (Guest.TPMMarker)")
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Tpm = &domainv1.TPM{} })
	lines := markerLines(vm.console.out.String(), s.guest.TPMMarker)
	switch {
	case len(lines) == 0:
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.TPMMarker, vm.console.out.Tail())
	case lines[0] == "none" || !slices.Contains(strings.Fields(lines[0]), "version=2"):
		t.Errorf("the guest's TPM is %q: no TPM 2.0, though the domain spec asked for one", lines[0])
	}
}

// requireDevice skips a check when the hypervisor does not declare device, or when the guest
// has no marker to show it by (noMarker says so).
func (s *vmSuite) requireDevice(t T, device, marker, noMarker string) {
	t.Helper()
	_, caps := s.hypervisor(t)
	if !slices.Contains(caps.GetDevices(), device) {
		t.Skipf("the hypervisor does not declare the device %q (Capabilities.devices: %v)", device, caps.GetDevices())
	}
	if marker == "" {
		t.Skipf("%s", noMarker)
	}
}

// markerLines returns the rest of every console line that starts with marker, trimmed.
func markerLines(console, marker string) []string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), marker); ok {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out
}
