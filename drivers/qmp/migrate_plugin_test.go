package qmp

import (
	"testing"

	"github.com/kubevisor/kubevisor/internal/kittest"
)

// The kit's Migrate checks against the real plugin binaries (two kubevisor-driver-qmp
// processes, each with a plugin host and state directory of its own, every VM under a
// kubevisor-launcher of its own) run in core/handler/migrationproxy's
// TestQMPMigrationThroughTheProxy, with the node agent's proxies between them; in-process they
// run in conformance/driver's TestVMRealDrivers.

// TestMigrationLocalDisksDiskBoot runs the kit's Migrate/LocalDisks check against the real
// plugin binaries, with the guest booting from its containerDisk under the
// BIOS: the VM then has the containerDisk's overlay as well as the emptyDisk, and the check
// copies the overlay's top image only (sync top: the target's fresh overlay is over the same
// base) and the emptyDisk whole, and reads a marker from each back on the target.
func TestMigrationLocalDisksDiskBoot(t *testing.T) {
	requireQEMU(t)
	r := kittest.RunVM(t, kittest.Options{Hypervisor: "qmp", Boot: "disk", Run: "Migrate/LocalDisks$"})
	t.Logf("kubevisor-conformance vm --boot disk --run Migrate/LocalDisks:\n%s", r.Stdout)
	kittest.ExpectPassed(t, r, "Migrate/LocalDisks")
	kittest.ExpectTopImageCopied(t, r)
}
