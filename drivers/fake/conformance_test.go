package fake_test

import (
	"testing"
	"time"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// TestConformance runs the conformance kit against every fake driver, served in-process.
func TestConformance(t *testing.T) {
	restart := conformance.WithRestart(func(conformance.T) driver.Hypervisor { return fake.NewHypervisor() })
	t.Run("Hypervisor", func(t *testing.T) {
		conformance.HypervisorTesting(t, fake.NewHypervisor(),
			conformance.WithName(fake.Name),
			conformance.WithConsoleMarker(fake.ConsoleMarker),
			restart)
	})
	t.Run("HypervisorSlowGuest", func(t *testing.T) {
		// Guests that boot slowly and ignore ACPI: every Shutdown ends forcibly at its timeout.
		conformance.HypervisorTesting(t, fake.NewHypervisor(),
			conformance.WithConfig([]byte(`{"ignoreShutdown": true, "bootDelay": "2ms"}`)),
			conformance.WithShutdownTimeout(20*time.Millisecond),
			conformance.WithConsoleMarker(fake.ConsoleMarker),
			restart)
	})
	t.Run("Network", func(t *testing.T) {
		conformance.NetworkTesting(t, fake.NewNetwork(), conformance.WithName(fake.Name))
	})
	t.Run("Storage", func(t *testing.T) {
		conformance.StorageTesting(t, fake.NewStorage(), conformance.WithName(fake.Name))
	})
	t.Run("Device", func(t *testing.T) {
		conformance.DeviceTesting(t, fake.NewDevice(),
			conformance.WithName(fake.Name),
			conformance.WithConfig([]byte(`{"count": 2, "unhealthy": ["tun-1"]}`)))
	})
}

// TestConformanceDirect runs the kit against the fake drivers called directly, without the
// plugin boundary, as a driver author may before serving their driver.
func TestConformanceDirect(t *testing.T) {
	t.Run("Hypervisor", func(t *testing.T) {
		h := fake.NewHypervisor()
		conformance.Hypervisor(conformance.FromTesting(t), func(conformance.T) driver.Hypervisor { return h },
			conformance.WithConsoleMarker(fake.ConsoleMarker),
			conformance.WithRestart(func(conformance.T) driver.Hypervisor { return fake.NewHypervisor() }))
	})
	t.Run("Network", func(t *testing.T) {
		conformance.Network(conformance.FromTesting(t), func(conformance.T) driver.Network { return fake.NewNetwork() })
	})
	t.Run("Storage", func(t *testing.T) {
		conformance.Storage(conformance.FromTesting(t), func(conformance.T) driver.Storage { return fake.NewStorage() })
	})
	t.Run("Device", func(t *testing.T) {
		conformance.Device(conformance.FromTesting(t), func(conformance.T) driver.Device { return fake.NewDevice() })
	})
}
