package libvirt

import (
	"context"
	"io"
	"os"
	"path/filepath"
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

// TestMigrationRecover restarts both drivers in the middle of a migration, as the death of
// their processes would (Close, then a new driver's Recover from the handle): the migration
// goes on in the two daemons. The target is re-adopted PAUSED (IncomingMigration) with its
// migration ACTIVE, the source RUNNING with its migration ACTIVE and still sending; once the
// limit is lifted (through libvirt, as a test only can) the new source driver reports the
// migration COMPLETED and the VM STOPPED (Migrated), the new target driver RUNNING (Migrated),
// and the guest answers on the target's console.
// migrationPair is a source VM running the test guest on one driver and its migration target
// waiting on another, each driver with a state dir of its own (two "nodes"), VMs without a
// launcher.
type migrationPair struct {
	ctx                  context.Context
	id                   string
	src, tgt             *Driver
	srcState, tgtState   string
	srcHandle, tgtHandle *hypervisorv1.Handle
	spec, tspec          *domainv1.DomainSpec
	drivers              *[]*Driver
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

func newMigrationPair(t *testing.T, ctx context.Context, id string) *migrationPair {
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
	if p.tgtHandle, err = p.tgt.Create(ctx, p.tspec); err != nil {
		t.Fatal(err)
	}
	if err := p.tgt.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMigrationRecover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = "lv-mig-recover"
	p := newMigrationPair(t, ctx, id)
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
