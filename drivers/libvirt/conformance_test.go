package libvirt

import (
	"os"
	"sync"
	"testing"
	"time"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// TestConformance runs the driver conformance kit against the driver, in process, with real
// libvirt daemons and QEMU booting the ACPI-aware echo boot sector. The restart hook lets go of
// the previous driver's VMs, as the death of its process would, and returns a new driver.
func TestConformance(t *testing.T) {
	requireLibvirt(t)
	img := bootDisk(t, reachableDir(t))
	var (
		mu     sync.Mutex
		impls  []*Driver
		newDrv = func() *Driver {
			d := New(WithLogger(testLogger()))
			mu.Lock()
			impls = append(impls, d)
			mu.Unlock()
			return d
		}
	)
	t.Cleanup(func() {
		for _, d := range impls {
			killAll(d)
		}
	})
	conformance.HypervisorTesting(t, newDrv(),
		conformance.WithName(Name),
		conformance.WithTimeout(time.Minute),
		conformance.WithShutdownTimeout(10*time.Second),
		conformance.WithConsoleMarker(qmp.BootSectorMarker),
		conformance.WithDomain(func(id, dir string) *domainv1.DomainSpec {
			spec := conformance.DefaultDomain(id, dir)
			// The kit's directories are go test's, longer than the driver's run dirs may be
			// (maxRunDir): a short one of its own.
			if len(spec.RunDir) > maxRunDir {
				short, err := os.MkdirTemp("", "lvc-")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.RemoveAll(short) })
				spec.RunDir = short
			}
			spec.Disks = []*domainv1.Disk{{Name: "boot", Path: img, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true, BootOrder: 1}}
			return spec
		}),
		conformance.WithRestart(func(conformance.T) driver.Hypervisor {
			mu.Lock()
			old := append([]*Driver(nil), impls...)
			mu.Unlock()
			for _, d := range old {
				_ = d.Close()
			}
			return newDrv()
		}),
	)
}
