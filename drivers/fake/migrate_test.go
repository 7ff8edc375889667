package fake_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// target makes a fake hypervisor with a VM waiting for a migration on sockets in a fresh run
// directory, and returns it with its memory and disks sockets.
func target(t *testing.T, disks ...string) (*fake.Hypervisor, string, string) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvf-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	h := fake.NewHypervisor()
	s := spec("vm", dir)
	s.IncomingMigration = &domainv1.IncomingMigration{SocketPath: filepath.Join(dir, "in.sock")}
	if len(disks) > 0 {
		s.IncomingMigration.DisksSocketPath, s.IncomingMigration.Disks = filepath.Join(dir, "disks.sock"), disks
		for _, d := range disks {
			s.Disks = append(s.Disks, &domainv1.Disk{Name: d, Path: filepath.Join(dir, d+".img")})
		}
	}
	if _, err := h.Create(t.Context(), s); err != nil {
		t.Fatalf("Create target: %v", err)
	}
	if err := h.Start(t.Context(), "vm"); err != nil {
		t.Fatalf("Start target: %v", err)
	}
	return h, s.IncomingMigration.SocketPath, s.IncomingMigration.DisksSocketPath
}

func waitMigrationPhase(t *testing.T, h *fake.Hypervisor, want hypervisorv1.MigrationPhase) *hypervisorv1.MigrationInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := h.MigrationStatus(t.Context(), "vm")
		if err == nil && info.GetPhase() == want {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("migration %v, %v; want phase %s", info, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMigrateOverSockets: a source streams its VM to a target waiting on a socket (with a disk
// on the disks socket): the target runs (Migrated, no boot of its own), the source stops
// (Migrated), both report the migration completed.
func TestMigrateOverSockets(t *testing.T) {
	dst, sock, disksSock := target(t, "root")
	if st := vmState(t, dst, "vm"); st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetReason() != driver.ReasonIncomingMigration {
		t.Fatalf("target before: %v", st)
	}
	src, _ := started(t, "{}")
	if err := src.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetSocketPath: sock,
		TargetDisksSocketPath: disksSock, Disks: []*hypervisorv1.MigrateDisk{{Name: "root", TopOnly: true}}}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	waitMigrationPhase(t, src, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED)
	if st := vmState(t, src, "vm"); st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrated {
		t.Errorf("source after: %v", st)
	}
	info := waitMigrationPhase(t, dst, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED)
	if info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET {
		t.Errorf("target's migration %v", info)
	}
	if st := vmState(t, dst, "vm"); st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetReason() != driver.ReasonMigrated || st.GetBoots() != 0 {
		t.Errorf("target after: %v; want RUNNING, Migrated, no boot", st)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("the target still listens after it runs")
	}
}

// TestMigrateOverSocketsFailsAndCancels: a stream that is not a migration fails the target;
// a source whose target never answers can be cancelled and runs on; a target cancelled before
// the stream stops.
func TestMigrateOverSocketsFailsAndCancels(t *testing.T) {
	t.Run("garbage stream", func(t *testing.T) {
		dst, sock, _ := target(t)
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("not a migration"))
		_ = c.(*net.UnixConn).CloseWrite()
		waitMigrationPhase(t, dst, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED)
		if st := vmState(t, dst, "vm"); st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrationFailed {
			t.Errorf("target: %v", st)
		}
		_ = c.Close()
	})
	t.Run("cancel at the source", func(t *testing.T) {
		dir, err := os.MkdirTemp("/tmp", "kvf-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		silent, err := net.Listen("unix", filepath.Join(dir, "silent.sock")) // accepts, never answers
		if err != nil {
			t.Fatal(err)
		}
		defer silent.Close()
		src, _ := started(t, "{}")
		if err := src.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetSocketPath: silent.Addr().String()}); err != nil {
			t.Fatal(err)
		}
		waitMigrationPhase(t, src, hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE)
		expectCode(t, src.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetSocketPath: silent.Addr().String()}), codes.FailedPrecondition, "migrating already")
		if err := src.CancelMigration(t.Context(), "vm"); err != nil {
			t.Fatal(err)
		}
		waitMigrationPhase(t, src, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED)
		if st := vmState(t, src, "vm"); st.GetState() != hypervisorv1.State_STATE_RUNNING {
			t.Errorf("source after the cancel: %v", st)
		}
	})
	t.Run("cancel at the target", func(t *testing.T) {
		dst, _, _ := target(t)
		if err := dst.CancelMigration(t.Context(), "vm"); err != nil {
			t.Fatal(err)
		}
		if st := vmState(t, dst, "vm"); st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrationCancelled {
			t.Errorf("target after the cancel: %v", st)
		}
	})
}
