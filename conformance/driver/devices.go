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
	_, caps := s.hypervisor(t)
	if !slices.Contains(caps.GetDevices(), driver.DeviceRNG) {
		t.Skipf("the hypervisor does not declare the device %q (Capabilities.devices: %v)", driver.DeviceRNG, caps.GetDevices())
	}
	if s.guest.RNGMarker == "" {
		t.Skipf("the guest lists no hardware RNGs (Guest.RNGMarker)")
	}
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) { spec.Rng = &domainv1.RNG{} })
	line, ok := markerLine(vm.console.out.String(), s.guest.RNGMarker)
	switch {
	case !ok:
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.RNGMarker, vm.console.out.Tail())
	case !strings.Contains(line, "virtio"):
		t.Errorf("the guest's hardware RNGs are %q: no virtio RNG, though the domain spec asked for one", line)
	}
}

// markerLine returns the rest of the first console line that starts with marker, trimmed.
func markerLine(console, marker string) (string, bool) {
	for _, l := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), marker); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}
