package libvirt

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// TestCapabilitiesDeclared: what the driver implements is declared (the kit skips the rest),
// and BuildDomain takes every device it declares.
func TestCapabilitiesDeclared(t *testing.T) {
	caps, err := New().Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []basev1.Feature{
		basev1.Feature_FEATURE_HYPERVISOR_PAUSE, basev1.Feature_FEATURE_HYPERVISOR_REBOOT,
		basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT, basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT,
		basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE,
		basev1.Feature_FEATURE_HYPERVISOR_DISPLAY, basev1.Feature_FEATURE_HYPERVISOR_RECOVER,
		basev1.Feature_FEATURE_HYPERVISOR_MIGRATE,
	} {
		if !slices.Contains(caps.GetFeatures(), f) {
			t.Errorf("Capabilities.features %v lacks %v", caps.GetFeatures(), f)
		}
	}
	for _, dev := range []string{driver.DeviceRNG, driver.DeviceBalloon, driver.DeviceChassis, driver.DeviceFeatures,
		driver.DeviceClock, driver.DeviceInput, driver.DeviceWatchdog, driver.DeviceSound, driver.DeviceCPUFeatures,
		driver.DeviceVirtioTransitional, driver.DeviceCPUPinning, driver.DeviceStartPaused, driver.DeviceDiskOptions, driver.DeviceNUMA} {
		if !slices.Contains(caps.GetDevices(), dev) {
			t.Errorf("Capabilities.devices %v lacks %q", caps.GetDevices(), dev)
		}
	}
	if !caps.GetPersistentState() {
		t.Errorf("Capabilities.persistent_state is false")
	}
	if !caps.GetMigrationDisks() {
		t.Errorf("Capabilities.migration_disks is false: the driver copies disks in a migration (migratedisks.go)")
	}
	if caps.GetMigrationPostCopy() {
		t.Errorf("Capabilities.migration_post_copy is true: libvirt refuses post-copy in the driver's tunnelled migration")
	}
	var _ driver.SoftRebooter = New()
	var _ driver.GuestAgent = New()
	var _ driver.GuestExecer = New()
	var _ driver.Displayer = New()
	var _ driver.Migrator = New()
}

// TestStartPaused: a VM whose spec starts paused is PAUSED after Start, its guest printing
// nothing, and runs once resumed.
func TestStartPaused(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	dir := reachableDir(t)
	spec := &domainv1.DomainSpec{
		Id: "lv-paused", Name: "test/lv-paused", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks:       []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1}},
		RunDir:      filepath.Join(dir, "run"),
		StartPaused: true,
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "lv-paused"); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "lv-paused", nil, out) }()
	st, _ := d.Status(ctx, "lv-paused")
	if st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetPid() == 0 {
		t.Fatalf("status after a paused start = %v, want PAUSED with QEMU's pid", st)
	}
	time.Sleep(3 * time.Second)
	if n := out.count(qmp.BootSectorMarker); n != 0 {
		t.Fatalf("the guest printed its marker %d times while started paused", n)
	}
	if st, _ := d.Status(ctx, "lv-paused"); st.GetState() != hypervisorv1.State_STATE_PAUSED {
		t.Fatalf("status 3 s after a paused start = %v, want PAUSED (libvirt's SUSPENDED event changes nothing)", st)
	}
	if err := d.Resume(ctx, "lv-paused"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the boot sector's marker after Resume", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
	if st, _ := d.Status(ctx, "lv-paused"); st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetBoots() != 1 {
		t.Fatalf("status after Resume = %v, want RUNNING, boots 1", st)
	}
}

// TestDiskOptionsBoot: libvirt takes a disk with every disk option (its own I/O thread, queues,
// threads I/O, block sizes, shared writing, an error policy) and the guest boots from it.
func TestDiskOptionsBoot(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	dir := reachableDir(t)
	spec := &domainv1.DomainSpec{
		Id: "lv-diskopts", Name: "test/lv-diskopts", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks: []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1,
			Io: "threads", DedicatedIothread: true, Queues: 2, LogicalBlockSize: 512, PhysicalBlockSize: 4096,
			Shareable: true, ErrorPolicy: "report"}},
		RunDir: filepath.Join(dir, "run"),
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "lv-diskopts"); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "lv-diskopts", nil, out) }()
	waitFor(t, "the boot sector's marker", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
}

// TestNUMABoot: libvirt takes two guest NUMA nodes, the first's memory bound to host node 0
// (which every Linux host has), and the guest boots. It starts paused and is resumed once the
// console is attached, so that the marker is on the console however loaded the machine is (two
// vCPUs under TCG beside other tests' QEMUs).
func TestNUMABoot(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	dir := reachableDir(t)
	spec := &domainv1.DomainSpec{
		Id: "lv-numa", Name: "test/lv-numa", Memory: &domainv1.Memory{GuestBytes: 128 << 20},
		Cpu: &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1, NumaCells: []*domainv1.NUMACell{
			{Vcpus: []uint32{0}, MemoryBytes: 64 << 20, HostNodes: []uint32{0}},
			{Vcpus: []uint32{1}, MemoryBytes: 64 << 20},
		}},
		Disks:       []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1}},
		RunDir:      filepath.Join(dir, "run"),
		StartPaused: true,
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "lv-numa"); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "lv-numa", nil, out) }()
	if err := d.Resume(ctx, "lv-numa"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the boot sector's marker", 2*time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
}
