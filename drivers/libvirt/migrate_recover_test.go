package libvirt

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/internal/kittest"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// migrationPair is a source VM running the test guest on one driver and its migration target
// waiting on another, each driver with a state dir of its own (two "nodes"), VMs without a
// launcher. With a data disk (newMigrationPair's dataBytes) the source has a raw disk "data"
// of random bytes and the target a zeroed one of the same size, which it receives
// (incoming_migration.disks).
type migrationPair struct {
	ctx                  context.Context
	id                   string
	src, tgt             *Driver
	srcState, tgtState   string
	srcHandle, tgtHandle *hypervisorv1.Handle
	spec, tspec          *domainv1.DomainSpec
	drivers              *[]*Driver
	dataPath, tdataPath  string // the data disk's images, when it has one
}

func (p *migrationPair) newDriver(t *testing.T, stateDir string) *Driver {
	t.Helper()
	d := New(WithLogger(testLogger()))
	if err := d.Configure(p.ctx, &basev1.ConfigureRequest{StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	*p.drivers = append(*p.drivers, d)
	return d
}

func newMigrationPair(t *testing.T, ctx context.Context, id string, dataBytes int64) *migrationPair {
	t.Helper()
	requireLibvirt(t)
	g, err := conformance.GuestFromDir(kittest.GuestDir(t))
	if err != nil {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	}
	drivers := []*Driver{}
	t.Cleanup(func() {
		for _, d := range drivers {
			killAll(d)
		}
	})
	p := &migrationPair{ctx: ctx, id: id, srcState: t.TempDir(), tgtState: t.TempDir(), drivers: &drivers}
	p.src, p.tgt = p.newDriver(t, p.srcState), p.newDriver(t, p.tgtState)
	runDir := func() string {
		dir, err := os.MkdirTemp("", "lvm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		return dir
	}
	srcDir := runDir()
	p.spec = &domainv1.DomainSpec{
		Id: id, Name: "test/" + id, Memory: &domainv1.Memory{GuestBytes: conformance.DefaultGuestMemory},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{KernelPath: g.Kernel, InitrdPath: g.Initrd, Cmdline: g.Cmdline}}},
		RunDir:   srcDir,
		Serial:   &domainv1.Serial{SocketPath: filepath.Join(srcDir, "serial.sock")},
	}
	image := func(dir string, random bool) string {
		b := make([]byte, dataBytes)
		if random {
			_, _ = rand.Read(b)
		}
		path := filepath.Join(dir, "data.raw")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if dataBytes > 0 {
		p.dataPath = image(srcDir, true)
		p.spec.Disks = []*domainv1.Disk{{Name: "data", Path: p.dataPath}}
	}
	if p.srcHandle, err = p.src.Create(ctx, p.spec); err != nil {
		t.Fatal(err)
	}
	if err := p.src.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = p.src.Console(ctx, id, nil, out) }()
	waitFor(t, "the guest's ready marker", 2*time.Minute, func() bool { return out.count(g.ReadyMarker) >= 1 })

	tgtDir := runDir()
	p.tspec = proto.CloneOf(p.spec)
	p.tspec.RunDir = tgtDir
	p.tspec.Serial = &domainv1.Serial{SocketPath: filepath.Join(tgtDir, "serial.sock")}
	p.tspec.IncomingMigration = &domainv1.IncomingMigration{SocketPath: filepath.Join(tgtDir, "migration.sock")}
	if dataBytes > 0 {
		p.tdataPath = image(tgtDir, false)
		p.tspec.Disks[0].Path = p.tdataPath
		p.tspec.IncomingMigration.Disks = []string{"data"}
		p.tspec.IncomingMigration.DisksSocketPath = filepath.Join(tgtDir, "disks.sock")
	}
	if p.tgtHandle, err = p.tgt.Create(ctx, p.tspec); err != nil {
		t.Fatal(err)
	}
	if err := p.tgt.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMigrationRecover restarts both drivers in the middle of a migration, as the death of
// their processes would (Close, then a new driver's Recover from the handle): the migration
// goes on in the two daemons. The target is re-adopted PAUSED (IncomingMigration) with its
// migration ACTIVE, the source RUNNING with its migration ACTIVE and still sending; once the
// limit is lifted (through libvirt, as a test only can) the new source driver reports the
// migration COMPLETED and the VM STOPPED (Migrated), the new target driver RUNNING (Migrated),
// and the guest answers on the target's console.
func TestMigrationRecover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = "lv-mig-recover"
	p := newMigrationPair(t, ctx, id, 0)
	src, tgt, tspec := p.src, p.tgt, p.tspec
	srcHandle, tgtHandle := p.srcHandle, p.tgtHandle
	if err := src.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tspec.IncomingMigration.SocketPath, BandwidthBytesPerSecond: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	var sent uint64
	waitFor(t, "the migration to send", time.Minute, func() bool {
		info, err := src.MigrationStatus(ctx, id)
		sent = info.GetTransferredBytes()
		return err == nil && info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE && sent > 0
	})

	// The target's driver restarts.
	_ = tgt.Close()
	tgt = p.newDriver(t, p.tgtState)
	st, err := tgt.Recover(ctx, tgtHandle)
	if err != nil {
		t.Fatalf("Recover of the target: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetReason() != driver.ReasonIncomingMigration {
		t.Errorf("the recovered target is %s (%s: %s), want PAUSED (%s)", st.GetState(), st.GetReason(), st.GetMessage(), driver.ReasonIncomingMigration)
	}
	if info, err := tgt.MigrationStatus(ctx, id); err != nil || info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
		t.Errorf("MigrationStatus of the recovered target = %v, %v; want TARGET, ACTIVE", info, err)
	}

	// The source's driver restarts.
	_ = src.Close()
	src = p.newDriver(t, p.srcState)
	st, err = src.Recover(ctx, srcHandle)
	if err != nil {
		t.Fatalf("Recover of the source: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("the recovered source is %s (%s: %s), want RUNNING", st.GetState(), st.GetReason(), st.GetMessage())
	}
	info, err := src.MigrationStatus(ctx, id)
	if err != nil || info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
		t.Fatalf("MigrationStatus of the recovered source = %v, %v; want SOURCE, ACTIVE", info, err)
	}
	waitFor(t, "the recovered migration to go on sending", 30*time.Second, func() bool {
		info, err := src.MigrationStatus(ctx, id)
		return err == nil && info.GetTransferredBytes() > sent
	})

	// Lift the limit, through the source's daemon.
	v, err := src.get(id)
	if err != nil {
		t.Fatal(err)
	}
	dom, err := v.domain()
	if err != nil {
		t.Fatal(err)
	}
	if err := dom.MigrateSetMaxSpeed(1<<20, 0); err != nil {
		t.Fatalf("lift the migration's bandwidth limit: %v", err)
	}
	dom.Free()
	waitFor(t, "the recovered migration to end", 2*time.Minute, func() bool {
		info, err = src.MigrationStatus(ctx, id)
		return err == nil && (info.GetEndedAt() != nil)
	})
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the recovered migration ended %s: %s", info.GetPhase(), info.GetMessage())
	}
	waitFor(t, "the source to stop", 30*time.Second, func() bool {
		st, _ := src.Status(ctx, id)
		return st.GetState() == hypervisorv1.State_STATE_STOPPED
	})
	if st, _ := src.Status(ctx, id); st.GetReason() != driver.ReasonMigrated {
		t.Errorf("the source stopped with reason %q, want %s", st.GetReason(), driver.ReasonMigrated)
	}
	waitFor(t, "the target to run", 30*time.Second, func() bool {
		st, _ := tgt.Status(ctx, id)
		return st.GetState() == hypervisorv1.State_STATE_RUNNING
	})
	if st, _ := tgt.Status(ctx, id); st.GetReason() != driver.ReasonMigrated || st.GetBoots() != 0 {
		t.Errorf("the target runs with reason %q and %d boots, want %s and 0", st.GetReason(), st.GetBoots(), driver.ReasonMigrated)
	}
	tout := &consoleBuf{}
	in, w := io.Pipe()
	go func() { _ = tgt.Console(ctx, id, in, tout) }()
	deadline := time.Now().Add(30 * time.Second)
	for tout.count("kv-recovered-42") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the migrated guest does not answer on the target's console")
		}
		_, _ = w.Write([]byte("echo kv-recovered-$((6*7))\n"))
		time.Sleep(time.Second)
	}
}

// startDiskMigration starts p's migration with its data disk, limited to bandwidth bytes/s, and
// returns once the copy has begun, with the bytes copied so far.
func startDiskMigration(t *testing.T, p *migrationPair, bandwidth uint64) uint64 {
	t.Helper()
	if err := p.src.Migrate(p.ctx, &hypervisorv1.MigrateRequest{Id: p.id, TargetSocketPath: p.tspec.IncomingMigration.SocketPath,
		TargetDisksSocketPath: p.tspec.IncomingMigration.DisksSocketPath, Disks: []*hypervisorv1.MigrateDisk{{Name: "data"}},
		BandwidthBytesPerSecond: bandwidth}); err != nil {
		t.Fatal(err)
	}
	var copied uint64
	waitFor(t, "the disk copy to start", time.Minute, func() bool {
		info, err := p.src.MigrationStatus(p.ctx, p.id)
		copied = info.GetDiskTransferredBytes()
		return err == nil && copied > 0
	})
	return copied
}

// storageDaemons lists the storage daemons running for the target's run dir.
func storageDaemons(p *migrationPair) []string {
	return slices.DeleteFunc(processesOf(p.tspec.GetRunDir()), func(s string) bool { return !strings.Contains(s, storageDaemonBinary) })
}

// TestMigrationDisksRecover restarts the source's driver in a migration's disk phase (32 MiB
// at 8 MiB/s), as the death of its process would: the new driver goes on with the disk phase it
// finds running in QEMU; the disk is copied, the memory moves, the target runs the VM
// (Migrated), its image is the source's byte for byte, and its storage daemon is gone.
func TestMigrationDisksRecover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = "lv-mig-drecover"
	p := newMigrationPair(t, ctx, id, 32<<20)
	copied := startDiskMigration(t, p, 8<<20)

	_ = p.src.Close()
	src := p.newDriver(t, p.srcState)
	if st, err := src.Recover(ctx, p.srcHandle); err != nil || st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("Recover of the source = %v, %v; want RUNNING", st, err)
	}
	waitFor(t, "the recovered copy to go on", time.Minute, func() bool {
		info, err := src.MigrationStatus(ctx, id)
		return err == nil && info.GetDiskTransferredBytes() > copied
	})
	var err error

	var info *hypervisorv1.MigrationInfo
	waitFor(t, "the recovered migration to end", 2*time.Minute, func() bool {
		info, err = src.MigrationStatus(ctx, id)
		return err == nil && info.GetEndedAt() != nil
	})
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the recovered migration ended %s: %s", info.GetPhase(), info.GetMessage())
	}
	waitFor(t, "the target to run", 30*time.Second, func() bool {
		st, _ := p.tgt.Status(ctx, id)
		return st.GetState() == hypervisorv1.State_STATE_RUNNING
	})
	want, _ := os.ReadFile(p.dataPath)
	got, _ := os.ReadFile(p.tdataPath)
	if len(want) == 0 || !bytes.Equal(got, want) {
		t.Errorf("the target's data disk (%d bytes) is not the source's (%d bytes)", len(got), len(want))
	}
	if left := storageDaemons(p); len(left) > 0 {
		t.Errorf("the target's storage daemon runs on: %v", left)
	}
}

// TestMigrationDisksTargetRestart restarts the target's driver in a migration's disk phase:
// the copy's connection ends with the old process's relay, so the new driver's Recover makes
// the storage daemon it finds quit and reports the target STOPPED (MigrationFailed); the
// source's copy fails, its migration FAILED naming the disk, and the VM runs on there.
func TestMigrationDisksTargetRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = "lv-mig-dtrestart"
	p := newMigrationPair(t, ctx, id, 32<<20)
	startDiskMigration(t, p, 1<<20)
	if len(storageDaemons(p)) != 1 {
		t.Fatalf("the target's storage daemon does not run: %v", processesOf(p.tspec.GetRunDir()))
	}

	_ = p.tgt.Close()
	tgt := p.newDriver(t, p.tgtState)
	st, err := tgt.Recover(ctx, p.tgtHandle)
	if err != nil {
		t.Fatalf("Recover of the target: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrationFailed || !strings.Contains(st.GetMessage(), "disks") {
		t.Errorf("the recovered target is %s (%s: %s), want STOPPED (%s) saying the disks' copy broke off", st.GetState(), st.GetReason(), st.GetMessage(), driver.ReasonMigrationFailed)
	}
	waitFor(t, "the target's storage daemon to go", 15*time.Second, func() bool { return len(storageDaemons(p)) == 0 })
	var info *hypervisorv1.MigrationInfo
	waitFor(t, "the source's migration to end", time.Minute, func() bool {
		info, err = p.src.MigrationStatus(ctx, id)
		return err == nil && info.GetEndedAt() != nil
	})
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED || !strings.Contains(info.GetMessage(), `disk "data"`) {
		t.Errorf("the source's migration ended %s (%q), want FAILED naming disk \"data\"", info.GetPhase(), info.GetMessage())
	}
	if st, _ := p.src.Status(ctx, id); st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("the source is %s (%s: %s), want RUNNING", st.GetState(), st.GetReason(), st.GetMessage())
	}
}
