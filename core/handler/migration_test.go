package handler

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// migrationPair is two handlers on one host, as the source and the target node of a migration:
// each its own state, run and volume directories and its own driver plugins.
func migrationPair(t *testing.T) (src, dst *Handler, srcEnv, dstEnv *env, cmdline string) {
	t.Helper()
	srcEnv, cmdline = newQMPGuestEnv(t)
	dstEnv, _ = newQMPGuestEnv(t)
	dstEnv.cfg.NodeName = "node-2"
	src, dst = srcEnv.start(), dstEnv.start()
	// A test that fails half-way leaves no QEMU behind (Close leaves VMs running).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, h := range []*Handler{src, dst} {
			for _, uid := range h.VMIs() {
				stub := &v1alpha1.VirtualMachineInstance{}
				stub.UID = uid
				_, _ = h.Stop(ctx, stub, 0)
			}
		}
	})
	return src, dst, srcEnv, dstEnv, cmdline
}

// waitMigration polls the source's MigrationStatus until the migration ends.
func waitMigration(t *testing.T, h *Handler, uid types.UID) *hypervisorv1.MigrationInfo {
	t.Helper()
	var info *hypervisorv1.MigrationInfo
	eventually(t, "the migration ends", 3*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		if info, err = h.MigrationStatus(ctx, uid); err != nil {
			return err
		}
		if driver.MigrationEnded(info.GetPhase()) {
			return nil
		}
		return fmt.Errorf("migration %s", info.GetPhase())
	})
	return info
}

// TestQMPMigrationBetweenHandlers: a running guest moves from one handler to another (two
// "nodes" on one host, the stream on the target's incoming socket directly). The target's
// SyncIncoming makes a VM that waits (PAUSED, IncomingMigration) and records the migration; the
// source's Migrate moves the guest; the guest then answers on the target's console with what it
// held in memory, without booting again; the target's Sync takes it as a VMI of its own (Running,
// the record cleared); the source's VM stopped as Migrated (MigratedAway) and its Stop leaves
// nothing behind.
func TestQMPMigrationBetweenHandlers(t *testing.T) {
	src, dst, _, dstEnv, cmdline := migrationPair(t)
	uid := types.UID("00000000-0000-4000-8000-0000000000a1")
	vmi := guestVMI("migrant", uid, cmdline)
	mustRun(t, src, vmi)
	c := attach(t, src, uid)
	eventually(t, "the guest boots", 3*time.Minute, func() error {
		if c.count(guestReady) == 0 {
			return fmt.Errorf("no %s on the console yet", guestReady)
		}
		return nil
	})
	if _, err := io.WriteString(c.in, "\necho kv-$((6*7))-state > /tmp/kv-state\nwhile :; do echo HB-tick; sleep 1; done &\n"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mig := types.UID("0000-mig-1")
	sock, err := dst.SyncIncoming(ctx, vmi, Incoming{MigrationUID: mig})
	if err != nil {
		t.Fatalf("SyncIncoming: %v", err)
	}
	if got, ok := dst.IncomingOf(uid); !ok || got != mig {
		t.Fatalf("IncomingOf = %q, %v; want %q", got, ok, mig)
	}
	if vs, err := vmOf(dst, "qmp", uid); err != nil || vs.GetState() != hypervisorv1.State_STATE_PAUSED || vs.GetReason() != driver.ReasonIncomingMigration {
		t.Fatalf("target VM before the migration: %v, %v; want PAUSED, %s", vs, err, driver.ReasonIncomingMigration)
	}
	// A second SyncIncoming is the same target; a plain Sync does not start it.
	if again, err := dst.SyncIncoming(ctx, vmi, Incoming{MigrationUID: mig}); err != nil || again != sock {
		t.Fatalf("SyncIncoming again = %q, %v; want %q", again, err, sock)
	}
	if _, err := dst.SyncIncoming(ctx, vmi, Incoming{MigrationUID: "0000-mig-other"}); err == nil {
		t.Fatal("SyncIncoming for another migration of a VMI waiting for one succeeded")
	}

	if err := src.Migrate(ctx, uid, Outgoing{MigrationUID: mig, TargetSocket: sock.Memory}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	info := waitMigration(t, src, uid)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("migration %s: %s", info.GetPhase(), info.GetMessage())
	}
	t.Logf("migrated in %s, downtime %s, %d bytes", info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(), info.GetTransferredBytes())
	eventually(t, "the source's VM stopped as migrated", 30*time.Second, func() error {
		if !src.MigratedAway(uid) {
			return fmt.Errorf("not MigratedAway yet")
		}
		return nil
	})

	st, err := dst.Sync(ctx, vmi)
	if err != nil || st.Phase != v1alpha1.Running {
		t.Fatalf("target Sync = %s, %v; want Running", st.Phase, err)
	}
	if _, ok := dst.IncomingOf(uid); ok {
		t.Error("the target still records the incoming migration after its VM runs")
	}
	vs, err := vmOf(dst, "qmp", uid)
	// The guest did not boot on the target: its VM counts no boot there.
	if err != nil || vs.GetState() != hypervisorv1.State_STATE_RUNNING || vs.GetReason() != driver.ReasonMigrated || vs.GetBoots() != 0 {
		t.Fatalf("target VM after the migration: %v, %v; want RUNNING (Migrated) with no boot of its own", vs, err)
	}
	tc := attach(t, dst, uid)
	if _, err := io.WriteString(tc.in, "\ncat /tmp/kv-state\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the migrated guest answers with its memory", time.Minute, func() error {
		if tc.count("kv-42-state") == 0 {
			return fmt.Errorf("no answer on the target's console")
		}
		return nil
	})
	if tc.count(guestReady) != 0 {
		t.Error("the guest booted again on the target")
	}
	// Its timers go on: the heartbeat started before the migration ticks on the target.
	beats := tc.count("HB-tick")
	eventually(t, "the guest's heartbeat goes on on the target", 30*time.Second, func() error {
		if n := tc.count("HB-tick"); n < beats+3 {
			return fmt.Errorf("%d heartbeats on the target's console, want %d", n, beats+3)
		}
		return nil
	})
	// What the target published while it waited is not the VMI's (the agent writes a target's
	// status only once it runs there); from then on it is Running.
	if last, ok := dstEnv.rec.last(uid); !ok || last.Phase != v1alpha1.Running {
		t.Errorf("target's last status %s, want Running", last.Phase)
	}

	if _, err := src.Stop(ctx, vmi, 10*time.Second); err != nil {
		t.Fatalf("source Stop: %v", err)
	}
	requireNothingLeft(t, src, uid)
	if final, err := dst.Stop(ctx, vmi, 30*time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
		t.Fatalf("target Stop = %s, %v", final.Phase, err)
	}
	requireNothingLeft(t, dst, uid)
}

// TestQMPMigrationCancelledKeepsSource: a migration throttled to a crawl is cancelled; the
// guest goes on running at the source, and the target's VM, stopped by the failed migration, is
// undone by Stop.
func TestQMPMigrationCancelledKeepsSource(t *testing.T) {
	src, dst, srcEnv, _, cmdline := migrationPair(t)
	uid := types.UID("00000000-0000-4000-8000-0000000000a2")
	vmi := guestVMI("stayer", uid, cmdline)
	mustRun(t, src, vmi)
	c := attach(t, src, uid)
	eventually(t, "the guest boots", 3*time.Minute, func() error {
		if c.count(guestReady) == 0 {
			return fmt.Errorf("no %s on the console yet", guestReady)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mig := types.UID("0000-mig-2")
	sock, err := dst.SyncIncoming(ctx, vmi, Incoming{MigrationUID: mig})
	if err != nil {
		t.Fatalf("SyncIncoming: %v", err)
	}
	if err := src.Migrate(ctx, uid, Outgoing{MigrationUID: mig, TargetSocket: sock.Memory, BandwidthBytesPerSecond: 1 << 20}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	time.Sleep(time.Second)
	if err := src.CancelMigration(ctx, uid); err != nil {
		t.Fatalf("CancelMigration: %v", err)
	}
	if info := waitMigration(t, src, uid); info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED {
		t.Fatalf("migration %s, want CANCELLED", info.GetPhase())
	}
	if src.MigratedAway(uid) {
		t.Fatal("the source's VM counts as migrated away after a cancel")
	}
	if _, err := io.WriteString(c.in, "\necho kv-still-$((6*7))\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the guest answers at the source", time.Minute, func() error {
		if c.count("kv-still-42") == 0 {
			return fmt.Errorf("no answer")
		}
		return nil
	})
	requireNeverFailed(t, srcEnv.rec, uid)
	if _, err := dst.Stop(ctx, vmi, 0); err != nil {
		t.Fatalf("target Stop: %v", err)
	}
	requireNothingLeft(t, dst, uid)
	if final, err := src.Stop(ctx, vmi, 30*time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
		t.Fatalf("source Stop = %s, %v", final.Phase, err)
	}
}
