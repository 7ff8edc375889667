package qmp

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

func TestMigrationDisks(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	spec := &domainv1.DomainSpec{Disks: []*domainv1.Disk{
		{Name: "root"}, {Name: "scratch"},
		{Name: "seed", Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
		{Name: "ro", ReadOnly: true}, {Name: "lun", Device: domainv1.DiskDevice_DISK_DEVICE_LUN},
	}}
	md := func(names ...string) []*hypervisorv1.MigrateDisk {
		var out []*hypervisorv1.MigrateDisk
		for _, n := range names {
			out = append(out, &hypervisorv1.MigrateDisk{Name: n, TopOnly: n == "root"})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		req    *hypervisorv1.MigrateRequest
		code   codes.Code
		naming string
	}{
		{"none", &hypervisorv1.MigrateRequest{}, codes.OK, ""},
		{"two disks", &hypervisorv1.MigrateRequest{Disks: md("root", "scratch"), TargetDisksSocketPath: sock}, codes.OK, ""},
		{"a socket without disks", &hypervisorv1.MigrateRequest{TargetDisksSocketPath: sock}, codes.InvalidArgument, "targetDisksSocketPath"},
		{"an unknown disk", &hypervisorv1.MigrateRequest{Disks: md("root", "nope"), TargetDisksSocketPath: sock}, codes.InvalidArgument, "disks[1]"},
		{"a disk twice", &hypervisorv1.MigrateRequest{Disks: md("root", "root"), TargetDisksSocketPath: sock}, codes.InvalidArgument, "disks[1]"},
		{"the cloud-init CD-ROM", &hypervisorv1.MigrateRequest{Disks: md("seed"), TargetDisksSocketPath: sock}, codes.InvalidArgument, "cdrom"},
		{"a read-only disk", &hypervisorv1.MigrateRequest{Disks: md("ro"), TargetDisksSocketPath: sock}, codes.InvalidArgument, "read-only"},
		{"a LUN", &hypervisorv1.MigrateRequest{Disks: md("lun"), TargetDisksSocketPath: sock}, codes.InvalidArgument, "lun"},
		{"disks without a socket", &hypervisorv1.MigrateRequest{Disks: md("root")}, codes.InvalidArgument, "targetDisksSocketPath"},
		{"a relative socket", &hypervisorv1.MigrateRequest{Disks: md("root"), TargetDisksSocketPath: "d.sock"}, codes.InvalidArgument, "targetDisksSocketPath"},
		{"no socket there", &hypervisorv1.MigrateRequest{Disks: md("root"), TargetDisksSocketPath: sock + "x"}, codes.FailedPrecondition, "targetDisksSocketPath"},
	} {
		disks, path, err := MigrationDisks(spec, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(strings.ToLower(status.Convert(err).Message()), strings.ToLower(tc.naming)) {
			t.Errorf("%s: MigrationDisks = %v, want %s naming %q", tc.name, err, tc.code, tc.naming)
		}
		if tc.name == "two disks" && (len(disks) != 2 || disks[0] != (DiskCopy{Name: "root", Index: 0, TopOnly: true}) || disks[1] != (DiskCopy{Name: "scratch", Index: 1}) || path != sock) {
			t.Errorf("two disks: %v %q", disks, path)
		}
	}
}

func TestMirrorsStateAndProgress(t *testing.T) {
	disks := []DiskCopy{{Name: "root", Index: 0, TopOnly: true}, {Name: "scratch", Index: 1}}
	job := func(id string, off, total uint64, ready bool, st, e string) blockJob {
		return blockJob{Device: id, Offset: off, Len: total, Ready: ready, Status: st, Error: e}
	}
	for _, tc := range []struct {
		name   string
		jobs   map[string]blockJob
		ready  bool
		failed string
	}{
		{"copying", map[string]blockJob{"kvmig-mirror0": job("kvmig-mirror0", 1, 2, false, "running", ""), "kvmig-mirror1": job("kvmig-mirror1", 2, 2, true, "ready", "")}, false, ""},
		{"all ready", map[string]blockJob{"kvmig-mirror0": job("kvmig-mirror0", 2, 2, true, "ready", ""), "kvmig-mirror1": job("kvmig-mirror1", 2, 2, true, "ready", "")}, true, ""},
		{"one failed", map[string]blockJob{"kvmig-mirror0": job("kvmig-mirror0", 1, 2, false, "concluded", "No space left on device"), "kvmig-mirror1": job("kvmig-mirror1", 2, 2, true, "ready", "")}, false, `disk "root" failed: No space left`},
		{"one gone", map[string]blockJob{"kvmig-mirror1": job("kvmig-mirror1", 2, 2, true, "ready", "")}, false, `disk "root" ended`},
	} {
		ready, failed := mirrorsState(disks, tc.jobs)
		if ready != tc.ready || (tc.failed == "") != (failed == "") || !strings.Contains(failed, tc.failed) {
			t.Errorf("%s: mirrorsState = %v, %q; want %v, %q", tc.name, ready, failed, tc.ready, tc.failed)
		}
	}
	info := &hypervisorv1.MigrationInfo{}
	applyJobs(info, disks, map[string]blockJob{"kvmig-mirror0": job("kvmig-mirror0", 65536, 65536, true, "ready", ""), "kvmig-mirror1": job("kvmig-mirror1", 1<<20, 16<<20, false, "running", "")})
	if info.GetDiskTotalBytes() != 65536+16<<20 || info.GetDiskTransferredBytes() != 65536+1<<20 || len(info.GetDisks()) != 2 ||
		!info.GetDisks()[0].GetReady() || !info.GetDisks()[0].GetTopOnly() || info.GetDisks()[1].GetReady() || info.GetDisks()[1].GetName() != "scratch" {
		t.Errorf("applyJobs: %v", info)
	}
	// Once the jobs are dismissed, the last figures stay.
	applyJobs(info, disks, nil)
	if info.GetDiskTransferredBytes() != 65536+1<<20 {
		t.Errorf("applyJobs without jobs changed the figures: %v", info)
	}
}
