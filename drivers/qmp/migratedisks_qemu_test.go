package qmp

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// dataDiskBytes is the size of the data disk the disk migration test copies.
const dataDiskBytes = 24 << 20

// rawImage writes a raw image of dataDiskBytes, random or zero.
func rawImage(t *testing.T, random bool) string {
	t.Helper()
	b := make([]byte, dataDiskBytes)
	if random {
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(t.TempDir(), "data.raw")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// diskTarget is src as the target of a migration that copies its data disk into a fresh image.
func diskTarget(t *testing.T, src *domainv1.DomainSpec) *domainv1.DomainSpec {
	t.Helper()
	spec := targetSpec(t, src, false)
	spec.Disks[0].Path = rawImage(t, false)
	spec.IncomingMigration.DisksSocketPath = filepath.Join(spec.GetRunDir(), "migration-disks.sock")
	spec.IncomingMigration.Disks = []string{"data"}
	return spec
}

// mirrorLeftovers lists the migration's block jobs and nbd nodes still in the VM's QEMU.
func mirrorLeftovers(t *testing.T, d *Driver, id string) []string {
	t.Helper()
	v, err := d.get(id)
	if err != nil {
		t.Fatal(err)
	}
	v.mu.Lock()
	s := v.sess
	v.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var left []string
	jobs, err := queryJobs(ctx, s.mon)
	if err != nil {
		t.Fatalf("query-block-jobs: %v", err)
	}
	for j := range jobs {
		left = append(left, "job "+j)
	}
	raw, err := s.mon.Run(ctx, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		t.Fatalf("query-named-block-nodes: %v", err)
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if strings.HasPrefix(n.NodeName, nbdNodePrefix) {
			left = append(left, "node "+n.NodeName)
		}
	}
	return left
}

// TestMigrationDisksRecoverCancelComplete: a VM with a 24 MiB raw data disk of random bytes
// (written from the host, not by the guest) migrates with the disk copied into a fresh zero
// image the target serves over NBD. The first migration, limited to 2 MiB/s, is in its disk
// phase (disk bytes moving, no memory sent) when the source's driver restarts: the new driver
// re-adopts it (RUNNING, the copy going on) and cancels it: CANCELLED, the VM RUNNING, no
// mirror job or NBD node left in the source's QEMU. The waiting target is killed and deleted
// (its NBD socket removed). A second migration, unlimited, completes: the target runs, its NBD
// socket is gone, and its image holds the source's bytes, every one.
func TestMigrationDisksRecoverCancelComplete(t *testing.T) {
	ctx := context.Background()
	stateA, stateB := t.TempDir(), t.TempDir()
	a, b := newTestDriver(t, stateA), newTestDriver(t, stateB)
	src := realGuestSpec(t, "migdisk")
	src.Disks = []*domainv1.Disk{{Name: "data", Path: rawImage(t, true), Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO}}
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

	tgt := diskTarget(t, src)
	if _, err := b.Create(ctx, tgt); err != nil {
		t.Fatalf("Create of the target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the target: %v", err)
	}
	nbd := tgt.GetIncomingMigration().GetDisksSocketPath()
	if fi, err := os.Stat(nbd); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the target that waits serves no socket at %s: %v", nbd, err)
	}
	disks := []*hypervisorv1.MigrateDisk{{Name: "data"}}
	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath(),
		TargetDisksSocketPath: nbd, Disks: disks, BandwidthBytesPerSecond: 2 << 20}); err != nil {
		t.Fatalf("Migrate copying the data disk: %v", err)
	}
	before := waitMigration(t, a, id, time.Minute, func(i *hypervisorv1.MigrationInfo) bool { return i.GetDiskTransferredBytes() > 1<<20 })
	if before.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE || before.GetTransferredBytes() != 0 || len(before.GetDisks()) != 1 || before.GetDisks()[0].GetReady() {
		t.Fatalf("the migration in its disk phase = %v, want ACTIVE, disk bytes moving, not ready, no memory sent", before)
	}
	t.Logf("disk phase: %d of %d bytes", before.GetDiskTransferredBytes(), before.GetDiskTotalBytes())

	// The source's driver restarts in the disk phase.
	_ = a.Close()
	a = newTestDriver(t, stateA)
	st, err := a.Recover(ctx, ha)
	if err != nil || st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("Recover of a source copying its disk = %v, %v; want RUNNING", st, err)
	}
	after := waitMigration(t, a, id, 30*time.Second, func(i *hypervisorv1.MigrationInfo) bool {
		return i.GetDiskTransferredBytes() > before.GetDiskTransferredBytes()
	})
	if after.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE || after.GetTransferredBytes() != 0 {
		t.Fatalf("the recovered migration = %v, want the disk copy going on, no memory sent", after)
	}
	if err := a.CancelMigration(ctx, id); err != nil {
		t.Fatalf("CancelMigration in the disk phase: %v", err)
	}
	if info, _ := a.MigrationStatus(ctx, id); info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED {
		t.Errorf("after CancelMigration: %v", info)
	}
	mustStatus(t, a, id, hypervisorv1.State_STATE_RUNNING)
	if left := mirrorLeftovers(t, a, id); len(left) > 0 {
		t.Errorf("the cancelled copy left %v in the source's QEMU", left)
	}
	// The host kills and deletes the target, which never got a memory stream.
	if err := b.Kill(ctx, id); err != nil {
		t.Fatalf("Kill of the waiting target: %v", err)
	}
	if err := b.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of the waiting target: %v", err)
	}
	if _, err := os.Lstat(nbd); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the deleted target's NBD socket %s is left: %v", nbd, err)
	}

	// A second target, and a migration that completes.
	tgt = diskTarget(t, src)
	nbd = tgt.GetIncomingMigration().GetDisksSocketPath()
	if _, err := b.Create(ctx, tgt); err != nil {
		t.Fatalf("Create of the second target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the second target: %v", err)
	}
	start := time.Now()
	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath(),
		TargetDisksSocketPath: nbd, Disks: disks}); err != nil {
		t.Fatalf("the second Migrate: %v", err)
	}
	info := waitMigration(t, a, id, 2*time.Minute, nil)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the second migration ended %v", info)
	}
	t.Logf("migrated with the data disk in %s: downtime %s, disk %d of %d bytes, memory %d bytes", time.Since(start).Round(time.Millisecond),
		info.GetDowntime().AsDuration(), info.GetDiskTransferredBytes(), info.GetDiskTotalBytes(), info.GetTransferredBytes())
	if info.GetDiskTransferredBytes() < dataDiskBytes {
		t.Errorf("the completed migration reports %d disk bytes copied, want at least %d", info.GetDiskTransferredBytes(), dataDiskBytes)
	}
	waitState(t, b, id, hypervisorv1.State_STATE_RUNNING, 30*time.Second)
	if _, err := os.Lstat(nbd); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the target runs and its NBD socket %s is still there: %v", nbd, err)
	}
	want, err := os.ReadFile(src.GetDisks()[0].GetPath())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(tgt.GetDisks()[0].GetPath())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the target's image (sha256 %x) is not the source's (sha256 %x)", sha256.Sum256(got), sha256.Sum256(want))
	}
}

// TestMigrationDisksPostCopy: a migration copying a 4 MiB random data disk, limited to 4 MiB/s,
// allowed post-copy with a completion timeout of 6 s: the disk is copied within the first
// seconds, the memory does not finish by the timeout, the driver switches to post-copy, which
// QEMU too pauses before (pre-switchover): the mirror completes there, the VM runs on the target
// in post-copy and the migration completes, the target's image the source's, byte for byte.
func TestMigrationDisksPostCopy(t *testing.T) {
	ctx := context.Background()
	a, b := newTestDriver(t, t.TempDir()), newTestDriver(t, t.TempDir())
	src := realGuestSpec(t, "migdiskpc")
	data := filepath.Join(t.TempDir(), "data.raw")
	buf := make([]byte, 4<<20)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, buf, 0o600); err != nil {
		t.Fatal(err)
	}
	src.Disks = []*domainv1.Disk{{Name: "data", Path: data, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO}}
	id := src.GetId()
	if _, err := a.Create(ctx, src); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, a, id)
	out.waitCount(t, conformance.GuestReadyMarker, 1, 2*time.Minute)
	tgt := targetSpec(t, src, true)
	empty := filepath.Join(t.TempDir(), "data.raw")
	if err := os.WriteFile(empty, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	tgt.Disks[0].Path = empty
	tgt.IncomingMigration.DisksSocketPath = filepath.Join(tgt.GetRunDir(), "migration-disks.sock")
	tgt.IncomingMigration.Disks = []string{"data"}
	if _, err := b.Create(ctx, tgt); err != nil {
		t.Fatalf("Create of the target: %v", err)
	}
	if err := b.Start(ctx, id); err != nil {
		t.Fatalf("Start of the target: %v", err)
	}
	if err := a.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: tgt.GetIncomingMigration().GetSocketPath(),
		TargetDisksSocketPath: tgt.GetIncomingMigration().GetDisksSocketPath(), Disks: []*hypervisorv1.MigrateDisk{{Name: "data"}},
		BandwidthBytesPerSecond: 4 << 20, AllowPostCopy: true, CompletionTimeout: durationpb.New(6 * time.Second)}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	info := waitMigration(t, a, id, 2*time.Minute, nil)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED || info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY {
		t.Fatalf("the migration = %v, want COMPLETED in POST_COPY", info)
	}
	t.Logf("post-copy with a disk: total %s, downtime %s, memory %d bytes, disk %d bytes", info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(), info.GetTransferredBytes(), info.GetDiskTransferredBytes())
	waitState(t, b, id, hypervisorv1.State_STATE_RUNNING, 30*time.Second)
	got, err := os.ReadFile(empty)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf) {
		t.Errorf("the target's image (sha256 %x) is not the source's (sha256 %x)", sha256.Sum256(got), sha256.Sum256(buf))
	}
}
