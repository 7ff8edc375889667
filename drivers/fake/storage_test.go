package fake_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

func writeImage(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.img")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestStorageVolumeTypes(t *testing.T) {
	s := fake.NewStorage()
	work := t.TempDir()
	base := writeImage(t, 4096)
	hostDisk := writeImage(t, 8192)
	created := filepath.Join(t.TempDir(), "created.img")
	vols := []*storagev1.Volume{
		{Name: "containerdisk", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "example/img", Path: base}}},
		{Name: "imagedir", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "example/dir", Path: t.TempDir()}}},
		{Name: "ephemeral", Source: &storagev1.Volume_Ephemeral{Ephemeral: &storagev1.Ephemeral{BackingPath: base}}},
		{Name: "scratch", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1 << 30}}},
		{Name: "hostdisk", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: hostDisk, Type: "Disk"}}},
		{Name: "created", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: created, Type: "DiskOrCreate", CapacityBytes: 1 << 20}}},
		{Name: "pvc", Source: &storagev1.Volume_PersistentVolumeClaim{PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{ClaimName: "c", Path: hostDisk, ReadOnly: true}}},
		{Name: "nocloud", Source: &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: &storagev1.CloudInit{UserData: []byte("#cloud-config\nhostname: x\n")}}},
		{Name: "configdrive", Source: &storagev1.Volume_CloudInitConfigDrive{CloudInitConfigDrive: &storagev1.CloudInit{InstanceId: "i-1"}}},
	}
	req := &storagev1.PrepareRequest{VmiId: "uid-1", WorkDir: work, Volumes: vols}
	resp, err := s.Prepare(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	disks := map[string]*storagev1.PreparedDisk{}
	for _, d := range resp.GetDisks() {
		disks[d.GetVolumeName()] = d
		if !exists(d.GetPath()) || d.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW {
			t.Errorf("%s: %v: path missing or not raw", d.GetVolumeName(), d)
		}
	}
	if d := disks["containerdisk"]; d.GetSizeBytes() != 4096 || filepath.Dir(d.GetPath()) != work {
		t.Errorf("containerdisk: %v, want a 4096-byte overlay in the work directory", d)
	}
	if d := disks["imagedir"]; d.GetSizeBytes() != 1<<30 {
		t.Errorf("imagedir: %v, want the nominal size", d)
	}
	if fi, err := os.Stat(disks["scratch"].GetPath()); err != nil || fi.Size() != 1<<30 {
		t.Errorf("scratch: %v %v, want a sparse file of the capacity", fi, err)
	}
	if d := disks["hostdisk"]; d.GetPath() != hostDisk || d.GetSizeBytes() != 8192 {
		t.Errorf("hostdisk: %v, want the host file in place", d)
	}
	if d := disks["pvc"]; d.GetPath() != hostDisk || !d.GetReadOnly() {
		t.Errorf("pvc: %v, want the claim's path, read-only", d)
	}
	for _, name := range []string{"nocloud", "configdrive"} {
		if d := disks[name]; !d.GetCdrom() || !d.GetReadOnly() || !strings.HasSuffix(d.GetPath(), ".iso") {
			t.Errorf("%s: %v, want a read-only CD-ROM", name, d)
		}
	}
	if b, _ := os.ReadFile(disks["nocloud"].GetPath()); !strings.Contains(string(b), "hostname: x") || !strings.Contains(string(b), "instance-id: uid-1") {
		t.Errorf("nocloud content %q lacks the user data or the instance id", b)
	}

	// Release one volume, then the rest.
	if err := s.Release(t.Context(), &storagev1.ReleaseRequest{VmiId: "uid-1", WorkDir: work, Volumes: vols[:1]}); err != nil {
		t.Fatal(err)
	}
	if exists(disks["containerdisk"].GetPath()) || !exists(disks["scratch"].GetPath()) {
		t.Errorf("Release of one volume released another or not it")
	}
	if err := s.Release(t.Context(), &storagev1.ReleaseRequest{VmiId: "uid-1", WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	for name, d := range disks {
		inWork := filepath.Dir(d.GetPath()) == work
		if exists(d.GetPath()) == inWork {
			t.Errorf("%s: after Release, %s exists=%v", name, d.GetPath(), !inWork)
		}
	}
	if entries, _ := os.ReadDir(work); len(entries) != 0 {
		t.Errorf("the work directory keeps %v after Release", entries)
	}
	if !exists(created) {
		t.Errorf("Release removed the hostDisk it created (the user's data)")
	}
}

func TestStorageRejects(t *testing.T) {
	s := fake.NewStorage()
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		name    string
		workDir string
		vol     *storagev1.Volume
		want    string
	}{
		{"RelativeWorkDir", "work", nil, "work_dir"},
		{"NoName", "", &storagev1.Volume{Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1}}}, "volumes[0].name"},
		{"PathName", "", &storagev1.Volume{Name: "../x", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1}}}, `"../x"`},
		{"NoCapacity", "", &storagev1.Volume{Name: "e", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{}}}, `"e"`},
		{"HostDiskType", "", &storagev1.Volume{Name: "h", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: missing}}}, "hostDisk.type"},
		{"HostDiskDir", "", &storagev1.Volume{Name: "h", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: t.TempDir(), Type: "Disk"}}}, "not a disk image"},
		{"CreateWithoutCapacity", "", &storagev1.Volume{Name: "h", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: missing, Type: "DiskOrCreate"}}}, "capacityBytes"},
		{"MissingPVC", "", &storagev1.Volume{Name: "p", Source: &storagev1.Volume_PersistentVolumeClaim{PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{Path: missing}}}, `volume "p"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			work := c.workDir
			if work == "" {
				work = t.TempDir()
			}
			req := &storagev1.PrepareRequest{VmiId: "v", WorkDir: work}
			if c.vol != nil {
				req.Volumes = []*storagev1.Volume{c.vol}
			}
			_, err := s.Prepare(t.Context(), req)
			expectCode(t, err, codes.InvalidArgument, c.want)
		})
	}
	t.Run("ForeignFile", func(t *testing.T) {
		work := t.TempDir()
		if err := os.WriteFile(filepath.Join(work, "scratch.img"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		vols := []*storagev1.Volume{
			{Name: "first", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1}}},
			{Name: "scratch", Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: 1}}},
		}
		_, err := s.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: vols})
		expectCode(t, err, codes.FailedPrecondition, "not made by this driver")
		entries, _ := os.ReadDir(work)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"scratch.img"}) {
			t.Errorf("after a failed Prepare the work directory holds %v, want only the foreign file", names)
		}
	})
}

func TestStoragePrepareDelay(t *testing.T) {
	s := fake.NewStorage()
	configure(t, s, `{"prepareDelay": "30ms"}`)
	begin := time.Now()
	if _, err := s.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(begin); elapsed < 30*time.Millisecond {
		t.Errorf("Prepare took %s, want at least the delay", elapsed)
	}
}
