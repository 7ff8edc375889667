package qmp

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// targetSpec is src as the target of its migration: a run directory of its own, receiving on a
// socket in it.
func targetSpec(t *testing.T, src *domainv1.DomainSpec, postCopy bool) *domainv1.DomainSpec {
	t.Helper()
	runDir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	killQEMUAtCleanup(t, runDir)
	spec := proto.CloneOf(src)
	spec.RunDir = runDir
	spec.IncomingMigration = &domainv1.IncomingMigration{SocketPath: filepath.Join(runDir, "migration.sock"), AllowPostCopy: postCopy}
	return spec
}

// copyMode is the mode in which d migrates a VM of spec without post-copy: PAUSED for an
// emulated VM on a QEMU that loses a live copy's writes (migrate.go), else PRE_COPY.
func copyMode(t *testing.T, d *Driver, spec *domainv1.DomainSpec) hypervisorv1.MigrationMode {
	t.Helper()
	host, err := d.hostInfo(context.Background())
	if err != nil {
		t.Fatalf("hostInfo: %v", err)
	}
	if wantAccel(spec.GetAcceleration(), host) == AccelTCG && TCGLosesMigrationWrites(host.Version) {
		return hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED
	}
	return hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY
}

// waitMigration polls d's MigrationStatus of id until cond holds or the migration ended.
func waitMigration(t *testing.T, d *Driver, id string, timeout time.Duration, cond func(*hypervisorv1.MigrationInfo) bool) *hypervisorv1.MigrationInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		info, err := d.MigrationStatus(context.Background(), id)
		if err != nil {
			t.Fatalf("MigrationStatus: %v", err)
		}
		if driver.MigrationEnded(info.GetPhase()) || cond != nil && cond(info) {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("the migration did not get there within %s: %v", timeout, info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMigrationRecoverAndPostCopy: both driver processes restart in the middle of a migration
// of the test guest, and the new ones carry on: the target that waits is PAUSED
// (IncomingMigration), the source RUNNING with its migration ACTIVE, which the new source
// driver cancels (the source runs on, the target stops MigrationFailed). Then a second
// migration, allowed post-copy and throttled to 1 MiB/s with a completion timeout of 2 s,
// switches to post-copy and completes: the source STOPPED (Migrated), the target RUNNING
// (Migrated) and answering on its console.
func TestMigrationRecoverAndPostCopy(t *testing.T) {
	ctx := context.Background()
	stateA, stateB := t.TempDir(), t.TempDir()
	a, b := newTestDriver(t, stateA), newTestDriver(t, stateB)
	src := realGuestSpec(t, "mig")
	id := src.GetId()
	ha, err := a.Create(ctx, src)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, a, id)
	out.waitCount(t, conformance.GuestReadyMarker, 1, 2*time.Minute)

	tgt := targetSpec(t, src, false)
	hb, err := b.Create(ctx, tgt)
	if err != nil {
		t.Fatalf("Create of the target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the target: %v", err)
	}
	// The target's driver restarts while it waits.
	_ = b.Close()
	b = newTestDriver(t, stateB)
	st, err := b.Recover(ctx, hb)
	if err != nil || st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetReason() != driver.ReasonIncomingMigration || st.GetBoots() != 0 {
		t.Fatalf("Recover of a target that waits = %v, %v; want PAUSED, IncomingMigration, 0 boots", st, err)
	}

	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath(), BandwidthBytesPerSecond: 1 << 20}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	before := waitMigration(t, a, id, time.Minute, func(i *hypervisorv1.MigrationInfo) bool { return i.GetTransferredBytes() > 1<<20 })
	if before.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
		t.Fatalf("the throttled migration = %v, want ACTIVE", before)
	}
	if want := copyMode(t, a, src); before.GetMode() != want {
		t.Errorf("the migration's mode %s, want %s", before.GetMode(), want)
	}
	// The source's driver restarts in the middle of the migration.
	_ = a.Close()
	a = newTestDriver(t, stateA)
	st, err = a.Recover(ctx, ha)
	if err != nil || st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("Recover of a source that migrates = %v, %v; want RUNNING", st, err)
	}
	after := waitMigration(t, a, id, 30*time.Second, func(i *hypervisorv1.MigrationInfo) bool {
		return i.GetTransferredBytes() > before.GetTransferredBytes()
	})
	if after.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE || after.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE {
		t.Fatalf("the recovered migration = %v, want an ACTIVE migration out going on", after)
	}
	if err := a.Pause(ctx, id); err == nil {
		t.Errorf("Pause of a VM that migrates succeeded")
	}
	if err := a.CancelMigration(ctx, id); err != nil {
		t.Fatalf("CancelMigration through the new driver: %v", err)
	}
	if info, _ := a.MigrationStatus(ctx, id); info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED {
		t.Errorf("after CancelMigration: %v", info)
	}
	mustStatus(t, a, id, hypervisorv1.State_STATE_RUNNING)
	// The guest runs at the source again (a paused migration's source is resumed): it answers
	// on its console, through the new driver.
	sout, sin, _ := attachConsole(t, a, id)
	for i := 0; i < 20 && !strings.Contains(sout.String(), "kv-stayed-42"); i++ {
		if _, err := io.WriteString(sin, "echo kv-stayed-$((6*7))\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	sout.waitCount(t, "kv-stayed-42", 1, 10*time.Second)
	if st := waitState(t, b, id, hypervisorv1.State_STATE_STOPPED, 30*time.Second); st.GetReason() != driver.ReasonMigrationFailed {
		t.Errorf("the target of the cancelled migration = %v, want reason %s", st, driver.ReasonMigrationFailed)
	}
	if err := b.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of the failed target: %v", err)
	}

	// Post-copy: a new target, prepared for it.
	tgt = targetSpec(t, src, true)
	if _, err := b.Create(ctx, tgt); err != nil {
		t.Fatalf("Create of the second target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the second target: %v", err)
	}
	ev := watchEvents(t, b, id)
	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath(),
		BandwidthBytesPerSecond: 1 << 20, AllowPostCopy: true, CompletionTimeout: durationpb.New(2 * time.Second)}); err != nil {
		t.Fatalf("Migrate allowing post-copy: %v", err)
	}
	info := waitMigration(t, a, id, 2*time.Minute, nil)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED || info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY {
		t.Fatalf("the migration allowed post-copy ended %v, want COMPLETED in POST_COPY", info)
	}
	t.Logf("post-copy migration: total %s, downtime %s, %d bytes", info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(), info.GetTransferredBytes())
	if st := waitState(t, a, id, hypervisorv1.State_STATE_STOPPED, 30*time.Second); st.GetReason() != driver.ReasonMigrated {
		t.Errorf("the source after post-copy = %v, want STOPPED, Migrated", st)
	}
	if st := waitState(t, b, id, hypervisorv1.State_STATE_RUNNING, 30*time.Second); st.GetReason() != driver.ReasonMigrated {
		t.Errorf("the target after post-copy = %v, want RUNNING, Migrated", st)
	}
	ev.waitTypes(t, 10*time.Second, hypervisorv1.EventType_EVENT_TYPE_STARTED)
	tout, in, _ := attachConsole(t, b, id)
	for i := 0; i < 10 && !strings.Contains(tout.String(), "kv-migrated-42"); i++ {
		if _, err := io.WriteString(in, "echo kv-migrated-$((6*7))\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	tout.waitCount(t, "kv-migrated-42", 1, 10*time.Second)
}

// TestMigrationDirtyingGuestKeepsItsMemory: the test guest rewrites 32 MiB of its memory (a
// tmpfs file) over and over while it migrates with no bandwidth limit; on the target it goes on
// with its memory intact: no kernel report of damage in the 15 s after, the loop and a heartbeat
// still running, and a file written before the migration read back. Under TCG on QEMU before
// 9.0 this is what the paused copy (migrate.go) is for: a live copy there lost writes, and the
// guest oopsed in some runs.
func TestMigrationDirtyingGuestKeepsItsMemory(t *testing.T) {
	ctx := context.Background()
	a, b := newTestDriver(t, t.TempDir()), newTestDriver(t, t.TempDir())
	src := realGuestSpec(t, "dirty")
	id := src.GetId()
	if _, err := a.Create(ctx, src); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, in, _ := attachConsole(t, a, id)
	out.waitCount(t, conformance.GuestReadyMarker, 1, 2*time.Minute)
	for _, c := range []string{
		"echo kv-$((6*7))-kept > /tmp/kv-kept\n",
		"while :; do dd if=/dev/zero of=/tmp/kv-dirty bs=1M count=32 2>/dev/null; echo DD-$((n=n+1)); done &\n",
		"while :; do echo HB-tick; sleep 0.2; done &\n",
	} {
		if _, err := io.WriteString(in, c); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out.waitCount(t, "DD-3", 1, time.Minute)

	tgt := targetSpec(t, src, false)
	if _, err := b.Create(ctx, tgt); err != nil {
		t.Fatalf("Create of the target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the target: %v", err)
	}
	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath()}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	info := waitMigration(t, a, id, 2*time.Minute, nil)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration ended %v, want COMPLETED", info)
	}
	if want := copyMode(t, a, src); info.GetMode() != want {
		t.Errorf("the migration's mode %s, want %s", info.GetMode(), want)
	}
	t.Logf("migrated a dirtying guest in %s mode: total %s, downtime %s, %d bytes in %d passes", info.GetMode(),
		info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(), info.GetTransferredBytes(), info.GetIterations())
	if st := waitState(t, b, id, hypervisorv1.State_STATE_RUNNING, 30*time.Second); st.GetReason() != driver.ReasonMigrated {
		t.Fatalf("the target = %v, want RUNNING, Migrated", st)
	}
	tout, tin, _ := attachConsole(t, b, id)
	beats := strings.Count(tout.String(), "HB-tick")
	time.Sleep(15 * time.Second)
	if m := conformance.GuestKernelTrouble.FindString(tout.String()); m != "" {
		t.Fatalf("the guest's kernel reported %q on the target after the migration; its console:\n%s", m, tout.String())
	}
	if n := strings.Count(tout.String(), "HB-tick"); n < beats+20 {
		t.Errorf("%d heartbeats on the target in 15 s (from %d), want 20 more", n, beats)
	}
	if !regexp.MustCompile(`DD-[0-9]+`).MatchString(tout.String()) {
		t.Errorf("the dirtying loop prints nothing on the target")
	}
	if _, err := io.WriteString(tin, "cat /tmp/kv-kept\n"); err != nil {
		t.Fatal(err)
	}
	tout.waitCount(t, "kv-42-kept", 1, 20*time.Second)
}
