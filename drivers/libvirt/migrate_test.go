package libvirt

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

func TestBandwidthMiB(t *testing.T) {
	for _, c := range []struct{ bps, mib uint64 }{{0, 0}, {1, 1}, {1 << 20, 1}, {16 << 20, 16}, {(16 << 20) + 1, 16}, {(2 << 20) - 1, 1}} {
		if got := bandwidthMiB(c.bps); got != c.mib {
			t.Errorf("bandwidthMiB(%d) = %d, want %d", c.bps, got, c.mib)
		}
	}
}

// TestMigrationDisksBadInput: a target spec whose incoming disks are not writable disks of it
// is refused at Create (InvalidArgument naming the field), and so is a MigrateRequest naming a
// disk the VM does not have or cannot copy, or with disks and no targetDisksSocketPath; one
// whose targetDisksSocketPath is no socket is FailedPrecondition naming the field.
func TestMigrationDisksBadInput(t *testing.T) {
	requireLibvirt(t)
	ctx := context.Background()
	d := newTestDriver(t)
	dir := reachableDir(t)
	spec := &domainv1.DomainSpec{
		Id: "lv-mig-disks", Name: "test/lv-mig-disks", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks: []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1},
			{Name: "data", Path: filepath.Join(dir, "data.img")}},
		RunDir: filepath.Join(dir, "run"),
	}
	for _, c := range []struct {
		disks  []string
		naming string
	}{
		{[]string{"nope"}, `incomingMigration.disks[0]: "nope" is not a disk`},
		{[]string{"data", "boot"}, `incomingMigration.disks[1]: disk "boot" is read-only`},
	} {
		target := proto.CloneOf(spec)
		target.IncomingMigration = &domainv1.IncomingMigration{SocketPath: filepath.Join(dir, "run", "migration.sock"),
			DisksSocketPath: filepath.Join(dir, "run", "disks.sock"), Disks: c.disks}
		if _, err := d.Create(ctx, target); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.naming) {
			t.Errorf("Create with incoming_migration.disks %v = %v, want InvalidArgument naming %q", c.disks, err, c.naming)
		}
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "target.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	notSocket := spec.Disks[0].Path
	for _, c := range []struct {
		req    *hypervisorv1.MigrateRequest
		code   codes.Code
		naming string
	}{
		{&hypervisorv1.MigrateRequest{Disks: []*hypervisorv1.MigrateDisk{{Name: "nope"}}, TargetDisksSocketPath: sock}, codes.InvalidArgument, `disks[0]: "nope" is not a disk`},
		{&hypervisorv1.MigrateRequest{Disks: []*hypervisorv1.MigrateDisk{{Name: "boot"}}, TargetDisksSocketPath: sock}, codes.InvalidArgument, `disks[0]: disk "boot" is read-only`},
		{&hypervisorv1.MigrateRequest{Disks: []*hypervisorv1.MigrateDisk{{Name: "data"}, {Name: "data"}}, TargetDisksSocketPath: sock}, codes.InvalidArgument, `disks[1]: disk "data" is named twice`},
		{&hypervisorv1.MigrateRequest{Disks: []*hypervisorv1.MigrateDisk{{Name: "data"}}}, codes.InvalidArgument, "targetDisksSocketPath: required"},
		{&hypervisorv1.MigrateRequest{Disks: []*hypervisorv1.MigrateDisk{{Name: "data"}}, TargetDisksSocketPath: notSocket}, codes.FailedPrecondition, "targetDisksSocketPath: " + notSocket + " is not a socket"},
	} {
		c.req.Id, c.req.TargetSocketPath = spec.Id, sock
		if err := d.Migrate(ctx, c.req); status.Code(err) != c.code || !strings.Contains(err.Error(), c.naming) {
			t.Errorf("Migrate(%v) = %v, want %s naming %q", c.req, err, c.code, c.naming)
		}
	}
}

// TestMigrationCompletionTimeout: a migration that cannot complete within its completion
// timeout is cancelled: CANCELLED with the timeout in its message, the source RUNNING (and no
// PAUSED reported), the target STOPPED (MigrationFailed); the target's socket_path is gone.
func TestMigrationCompletionTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newMigrationPair(t, ctx, "lv-mig-timeout", 0)
	var paused atomic.Bool
	go func() {
		_ = p.src.Events(ctx, p.id, func(e *hypervisorv1.Event) error {
			if e.GetType() == hypervisorv1.EventType_EVENT_TYPE_PAUSED {
				paused.Store(true)
			}
			return nil
		})
	}()
	start := time.Now()
	if err := p.src.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: p.id, TargetSocketPath: p.tspec.GetIncomingMigration().GetSocketPath(),
		BandwidthBytesPerSecond: 1 << 20, CompletionTimeout: durationpb.New(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	var info *hypervisorv1.MigrationInfo
	waitFor(t, "the migration to end", time.Minute, func() bool {
		var err error
		info, err = p.src.MigrationStatus(ctx, p.id)
		return err == nil && info.GetEndedAt() != nil
	})
	took := time.Since(start)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED || !strings.Contains(info.GetMessage(), "completion timeout of 3s") {
		t.Errorf("the migration past its completion timeout ended %s (%q), want CANCELLED naming the timeout", info.GetPhase(), info.GetMessage())
	}
	if took < 3*time.Second || took > 20*time.Second {
		t.Errorf("the migration with a completion timeout of 3s ended after %s", took)
	}
	if st, _ := p.src.Status(ctx, p.id); st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("the source after its cancelled migration is %s (%s)", st.GetState(), st.GetReason())
	}
	waitFor(t, "the target to stop", 30*time.Second, func() bool {
		st, _ := p.tgt.Status(ctx, p.id)
		return st.GetState() == hypervisorv1.State_STATE_STOPPED
	})
	if st, _ := p.tgt.Status(ctx, p.id); st.GetReason() != driver.ReasonMigrationFailed {
		t.Errorf("the target stopped with reason %q (%s), want %s", st.GetReason(), st.GetMessage(), driver.ReasonMigrationFailed)
	}
	if paused.Load() {
		t.Errorf("the source reported PAUSED during its migration")
	}
	waitFor(t, "the target's socket_path to go", 10*time.Second, func() bool {
		v, err := p.tgt.get(p.id)
		if err != nil {
			return false
		}
		_, err = os.Lstat(v.incomingLink())
		return err != nil
	})
}

// TestMigrationDirtyingGuestKeepsItsMemory: a guest rewriting 32 MiB of its memory in a loop
// migrates and runs on at the target with its memory whole: no kernel report on the target's
// console for 15 s, its loops go on, a file it wrote before is intact. Under emulation on a QEMU
// before 9.0 (this machine's 7.2) the migration is paused (MIGRATION_MODE_PAUSED, the copy
// counted as downtime): a live copy there loses guest writes (qmp.TCGLosesMigrationWrites).
func TestMigrationDirtyingGuestKeepsItsMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newMigrationPair(t, ctx, "lv-mig-dirty", 0)
	out := &consoleBuf{}
	in, w := io.Pipe()
	go func() { _ = p.src.Console(ctx, p.id, in, out) }()
	for _, c := range []string{
		"echo kv-$((6*7))-kept > /tmp/kv-kept\n",
		"while :; do dd if=/dev/zero of=/tmp/kv-dirty bs=1M count=32 2>/dev/null; echo DD-$((n=n+1)); done &\n",
		"while :; do echo HB-tick; sleep 0.2; done &\n",
	} {
		if _, err := io.WriteString(w, c); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, "the guest's dd loop", time.Minute, func() bool { return out.count("DD-3") >= 1 })
	if err := p.src.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: p.id, TargetSocketPath: p.tspec.GetIncomingMigration().GetSocketPath()}); err != nil {
		t.Fatal(err)
	}
	var info *hypervisorv1.MigrationInfo
	waitFor(t, "the migration to end", 2*time.Minute, func() bool {
		var err error
		info, err = p.src.MigrationStatus(ctx, p.id)
		return err == nil && info.GetEndedAt() != nil
	})
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration ended %s: %s", info.GetPhase(), info.GetMessage())
	}
	host, err := p.src.hostInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paused := !host.KVM && qmp.TCGLosesMigrationWrites(host.Version)
	t.Logf("QEMU %s, kvm %v: migrated in %s, mode %s, downtime %s, %d bytes", host.Version, host.KVM, info.GetTotalTime().AsDuration(), info.GetMode(), info.GetDowntime().AsDuration(), info.GetTransferredBytes())
	if paused && (info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED || info.GetDowntime().AsDuration() < info.GetTotalTime().AsDuration()/2) {
		t.Errorf("an emulated VM on QEMU %s migrated in mode %s with downtime %s of %s: want PAUSED, the copy counted as downtime",
			host.Version, info.GetMode(), info.GetDowntime().AsDuration(), info.GetTotalTime().AsDuration())
	}
	waitFor(t, "the target to run", 30*time.Second, func() bool {
		st, _ := p.tgt.Status(ctx, p.id)
		return st.GetState() == hypervisorv1.State_STATE_RUNNING
	})
	tout := &consoleBuf{}
	tin, tw := io.Pipe()
	go func() { _ = p.tgt.Console(ctx, p.id, tin, tout) }()
	waitFor(t, "the guest's loops on the target", 30*time.Second, func() bool { return tout.count("HB-tick") >= 3 && tout.count("DD-") >= 1 })
	time.Sleep(15 * time.Second)
	if _, err := io.WriteString(tw, "cat /tmp/kv-kept\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the file written before the migration", 30*time.Second, func() bool { return tout.count("kv-42-kept") >= 1 })
	tout.mu.Lock()
	text := tout.buf.String()
	tout.mu.Unlock()
	if m := conformance.GuestKernelTrouble.FindString(text); m != "" {
		t.Errorf("the migrated guest's kernel reports %q on the target's console:\n%s", m, text)
	}
}
