package qmp

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// TestConformance runs the driver conformance kit against the driver, with real QEMU booting the
// ACPI-aware echo boot sector (so that Shutdown is graceful and quick). The restart hook makes
// the previous driver let go of its VMs, as the death of its process would, and returns a new
// one.
func TestConformance(t *testing.T) {
	t.Parallel()
	requireQEMU(t)
	img := filepath.Join(t.TempDir(), "boot.img")
	if err := WriteBootDisk(img, EchoBootSector(true)); err != nil {
		t.Fatal(err)
	}
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
		conformance.WithConsoleMarker(BootSectorMarker),
		conformance.WithDomain(func(id, dir string) *domainv1.DomainSpec {
			spec := conformance.DefaultDomain(id, dir)
			// One image for every VM: read-only, so that QEMU's image locks allow it.
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

// killAll kills every QEMU the driver runs and waits for each to be accounted for.
func killAll(d *Driver) {
	d.mu.Lock()
	vms := make([]*vm, 0, len(d.vms))
	for _, v := range d.vms {
		vms = append(vms, v)
	}
	d.mu.Unlock()
	for _, v := range vms {
		v.mu.Lock()
		s := v.sess
		v.mu.Unlock()
		if s != nil {
			_ = s.proc.kill()
			waitClosed(s.done, 10*time.Second)
		}
	}
}
