package qmp

import (
	"testing"

	"github.com/kubevisor/kubevisor/internal/kittest"
)

// TestMigrationConformancePlugins runs the kit's Migrate checks against the real plugin
// binaries, as `kubevisor-conformance vm --run Migrate` does: two kubevisor-driver-qmp
// processes, each started by a plugin host of its own with its own state directory (two
// "nodes" on this host), every VM under a kubevisor-launcher of its own, the test guest booting
// its kernel under TCG and moving from one to the other over a unix socket. The checks' log
// lines (timings, progress samples) are in the test's output with -v.
func TestMigrationConformancePlugins(t *testing.T) {
	requireQEMU(t)
	r := kittest.RunVM(t, kittest.Options{Hypervisor: "qmp", Run: "Migrate"})
	t.Logf("kubevisor-conformance vm --run Migrate:\n%s", r.Stdout)
	kittest.ExpectPassed(t, r, "Migrate/KeepsGuestState", "Migrate/Progress", "Migrate/Cancel", "Migrate/LocalDisks", "Migrate/LocalDisksCancel")
}

// TestMigrationLocalDisksDiskBoot runs the kit's Migrate/LocalDisks check as
// TestMigrationConformancePlugins does, with the guest booting from its containerDisk under the
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
