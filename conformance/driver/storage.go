package conformance

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Storage runs the conformance checks of a storage driver as subtests of t: the checks of
// every driver, then
//
//	Prepare/EmptyDisk                  (volume type emptyDisk)
//	Prepare/CloudInit                  (volume type cloudInitNoCloud)
//	Prepare/Idempotent
//	Prepare/MissingSource
//	Prepare/SourceNotFound             (containerDisk, ephemeral, hostDisk, persistentVolumeClaim)
//	Release/Twice, Release/WithoutPrepare, Release/RemovesDisks, Release/OnlyOwnFiles
//
// Checks that need some volume use an emptyDisk, or a cloudInitNoCloud volume when the driver
// does not declare emptyDisk. The driver and the kit must see the same file system.
func Storage(t T, f StorageFactory, opts ...Option) {
	t.Helper()
	s := &storageSuite{newSuite(t, basev1.Kind_KIND_STORAGE, func(t T) driver.Driver { return nilIfNil(f(t)) }, opts)}
	s.baseChecks(t)
	t.Run("Prepare", func(t T) {
		t.Run("EmptyDisk", s.checkPrepareEmptyDisk)
		t.Run("CloudInit", s.checkPrepareCloudInit)
		t.Run("Idempotent", s.checkPrepareIdempotent)
		t.Run("MissingSource", s.checkPrepareMissingSource)
		t.Run("SourceNotFound", s.checkPrepareSourceNotFound)
	})
	t.Run("Release", func(t T) {
		t.Run("Twice", s.checkReleaseTwice)
		t.Run("WithoutPrepare", s.checkReleaseWithoutPrepare)
		t.Run("RemovesDisks", s.checkReleaseRemovesDisks)
		t.Run("OnlyOwnFiles", s.checkReleaseOnlyOwnFiles)
	})
}

type storageSuite struct{ *suite }

// emptyDiskSize is the capacity of the empty disks the checks ask for.
const emptyDiskSize = 16 << 20

func (s *storageSuite) storage(t T) (driver.Storage, *basev1.Capabilities) {
	t.Helper()
	d := s.driver(t).(driver.Storage)
	return d, s.capabilities(t, d)
}

// requireVolumeType skips the check unless caps declares the volume type.
func requireVolumeType(t T, caps *basev1.Capabilities, typ string) {
	t.Helper()
	if !slices.Contains(caps.GetVolumeTypes(), typ) {
		t.Skipf("driver does not declare volume type %s", typ)
	}
}

func emptyDisk(name string) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: emptyDiskSize}}}
}

func cloudInit(name string) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: &storagev1.CloudInit{
		UserData: []byte("#cloud-config\n# kubevisor conformance\n"),
		Hostname: "conformance",
	}}}
}

// simpleVolume returns a volume the driver can make from nothing (an emptyDisk, else a
// cloudInitNoCloud volume), or nil.
func simpleVolume(caps *basev1.Capabilities, name string) *storagev1.Volume {
	switch {
	case slices.Contains(caps.GetVolumeTypes(), "emptyDisk"):
		return emptyDisk(name)
	case slices.Contains(caps.GetVolumeTypes(), "cloudInitNoCloud"):
		return cloudInit(name)
	}
	return nil
}

// requireSimpleVolume returns simpleVolume, skipping the check when there is none.
func requireSimpleVolume(t T, caps *basev1.Capabilities, name string) *storagev1.Volume {
	t.Helper()
	v := simpleVolume(caps, name)
	if v == nil {
		t.Skipf("driver declares neither volume type emptyDisk nor cloudInitNoCloud")
	}
	return v
}

// request is one VMI's volumes, reused for Prepare and Release.
type request struct {
	vmiID   string
	workDir string
	volumes []*storagev1.Volume
}

func newRequest(t T, volumes ...*storagev1.Volume) *request {
	return &request{vmiID: newID(), workDir: t.TempDir(), volumes: volumes}
}

func (r *request) prepare() *storagev1.PrepareRequest {
	return &storagev1.PrepareRequest{VmiId: r.vmiID, WorkDir: r.workDir, Volumes: r.volumes}
}

func (r *request) release() *storagev1.ReleaseRequest {
	return &storagev1.ReleaseRequest{VmiId: r.vmiID, WorkDir: r.workDir, Volumes: r.volumes}
}

// prepare prepares r, which is released when the check ends, and checks the result's form.
func (s *storageSuite) prepare(t T, d driver.Storage, r *request) []*storagev1.PreparedDisk {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := s.cleanupCtx()
		defer cancel()
		if err := d.Release(ctx, r.release()); err != nil {
			t.Logf("cleanup: Release %s: %s", r.vmiID, describe(err))
		}
	})
	resp, err := d.Prepare(s.ctx(t), r.prepare())
	if err != nil {
		t.Fatalf("Prepare: %s", describe(err))
	}
	disks := resp.GetDisks()
	if len(disks) != len(r.volumes) {
		t.Fatalf("Prepare returned %d disks for %d volumes: %v", len(disks), len(r.volumes), disks)
	}
	for i, disk := range disks {
		name := r.volumes[i].GetName()
		if disk.GetVolumeName() != name {
			t.Errorf("Prepare disk %d is of volume %q, want %q (disks follow the order of the request)", i, disk.GetVolumeName(), name)
		}
		if !filepath.IsAbs(disk.GetPath()) {
			t.Errorf("volume %q: disk path %q is not absolute", name, disk.GetPath())
		} else if _, err := os.Stat(disk.GetPath()); err != nil {
			t.Errorf("volume %q: disk path: %v", name, err)
		}
		if disk.GetFormat() == domainv1.DiskFormat_DISK_FORMAT_UNSPECIFIED {
			t.Errorf("volume %q: disk format is unspecified", name)
		}
	}
	return disks
}

// inside reports whether path is dir or under it.
func inside(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkPrepareEmptyDisk: an emptyDisk becomes a writable disk of at least its capacity, under
// the work directory.
func (s *storageSuite) checkPrepareEmptyDisk(t T) {
	d, caps := s.storage(t)
	requireVolumeType(t, caps, "emptyDisk")
	r := newRequest(t, emptyDisk("scratch"))
	disk := s.prepare(t, d, r)[0]
	if !inside(r.workDir, disk.GetPath()) {
		t.Errorf("the emptyDisk is at %s, not under the work directory %s", disk.GetPath(), r.workDir)
	}
	if disk.GetReadOnly() || disk.GetCdrom() {
		t.Errorf("the emptyDisk is read-only=%v cdrom=%v, want a writable disk", disk.GetReadOnly(), disk.GetCdrom())
	}
	if size := disk.GetSizeBytes(); size != 0 && size < emptyDiskSize {
		t.Errorf("the emptyDisk is %d bytes, less than the %d asked", size, emptyDiskSize)
	}
}

// checkPrepareCloudInit: cloud-init data becomes a read-only CD-ROM.
func (s *storageSuite) checkPrepareCloudInit(t T) {
	d, caps := s.storage(t)
	requireVolumeType(t, caps, "cloudInitNoCloud")
	r := newRequest(t, cloudInit("cloudinitdisk"))
	disk := s.prepare(t, d, r)[0]
	if !disk.GetCdrom() || !disk.GetReadOnly() {
		t.Errorf("the cloud-init disk is read-only=%v cdrom=%v, want a read-only CD-ROM", disk.GetReadOnly(), disk.GetCdrom())
	}
}

// checkPrepareIdempotent: Prepare of a prepared VMI returns the same disks and keeps the files.
func (s *storageSuite) checkPrepareIdempotent(t T) {
	d, caps := s.storage(t)
	r := newRequest(t, requireSimpleVolume(t, caps, "scratch"))
	first := s.prepare(t, d, r)
	before, _ := os.Stat(first[0].GetPath())
	resp, err := d.Prepare(s.ctx(t), r.prepare())
	if err != nil {
		t.Fatalf("Prepare of a prepared VMI: %s, want success", describe(err))
	}
	if !slices.EqualFunc(first, resp.GetDisks(), func(a, b *storagev1.PreparedDisk) bool { return proto.Equal(a, b) }) {
		t.Errorf("Prepare of a prepared VMI returned other disks:\nfirst:  %v\nsecond: %v", first, resp.GetDisks())
	}
	if after, err := os.Stat(first[0].GetPath()); err != nil {
		t.Errorf("after a second Prepare: %v", err)
	} else if r.volumes[0].GetEmptyDisk() != nil && before != nil && !os.SameFile(before, after) {
		t.Errorf("a second Prepare replaced the emptyDisk file %s: what the guest wrote would be lost", first[0].GetPath())
	}
}

// listDir returns the names under dir, recursively.
func listDir(dir string) []string {
	var names []string
	_ = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err == nil && path != dir {
			names = append(names, strings.TrimPrefix(path, dir+string(filepath.Separator)))
		}
		return nil
	})
	return names
}

// expectPrepareRefused checks that Prepare of r, whose volume bad is not usable, is
// InvalidArgument naming bad and leaves the work directory as it was: what it made for the
// volumes before bad is removed again.
func (s *suite) expectPrepareRefused(t T, d driver.Storage, r *request, bad, what string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := s.cleanupCtx()
		defer cancel()
		_ = d.Release(ctx, r.release())
	})
	before := listDir(r.workDir)
	_, err := d.Prepare(s.ctx(t), r.prepare())
	if expectCode(t, err, codes.InvalidArgument, what) {
		expectMessageNames(t, err, what, bad)
	}
	if after := listDir(r.workDir); !slices.Equal(before, after) {
		t.Errorf("a failed Prepare left files in the work directory: before %v, after %v", before, after)
	}
}

// checkPrepareMissingSource: a volume without a source is InvalidArgument naming the volume,
// and what Prepare made for the volumes before it is removed.
func (s *storageSuite) checkPrepareMissingSource(t T) {
	d, caps := s.storage(t)
	const bad = "conformance-nosource"
	r := newRequest(t)
	if v := simpleVolume(caps, "scratch"); v != nil {
		r.volumes = append(r.volumes, v)
	}
	r.volumes = append(r.volumes, &storagev1.Volume{Name: bad})
	s.expectPrepareRefused(t, d, r, bad, "Prepare of a volume without a source")
}

// checkPrepareSourceNotFound: a volume whose image does not exist is InvalidArgument naming
// the volume, for every declared volume type that names an image.
func (s *storageSuite) checkPrepareSourceNotFound(t T) {
	d, caps := s.storage(t)
	missing := filepath.Join(t.TempDir(), "missing.img")
	volumes := map[string]*storagev1.Volume{
		"containerDisk": {Name: "conformance-containerdisk", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "example.com/missing:latest", Path: missing}}},
		"ephemeral":     {Name: "conformance-ephemeral", Source: &storagev1.Volume_Ephemeral{Ephemeral: &storagev1.Ephemeral{BackingPath: missing}}},
		"hostDisk":      {Name: "conformance-hostdisk", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: missing, Type: "Disk"}}},
		"persistentVolumeClaim": {Name: "conformance-pvc", Source: &storagev1.Volume_PersistentVolumeClaim{
			PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{ClaimName: "missing", Path: missing},
		}},
	}
	tried := 0
	for _, typ := range []string{"containerDisk", "ephemeral", "hostDisk", "persistentVolumeClaim"} {
		if !slices.Contains(caps.GetVolumeTypes(), typ) {
			continue
		}
		tried++
		r := newRequest(t, volumes[typ])
		t.Cleanup(func() {
			ctx, cancel := s.cleanupCtx()
			defer cancel()
			_ = d.Release(ctx, r.release())
		})
		_, err := d.Prepare(s.ctx(t), r.prepare())
		what := "Prepare of a " + typ + " volume whose image does not exist"
		if expectCode(t, err, codes.InvalidArgument, what) {
			expectMessageNames(t, err, what, volumes[typ].GetName())
		}
	}
	if tried == 0 {
		t.Skipf("driver declares none of the volume types containerDisk, ephemeral, hostDisk, persistentVolumeClaim")
	}
}

// checkReleaseTwice: Release succeeds twice.
func (s *storageSuite) checkReleaseTwice(t T) {
	d, caps := s.storage(t)
	r := newRequest(t, requireSimpleVolume(t, caps, "scratch"))
	s.prepare(t, d, r)
	expectCode(t, d.Release(s.ctx(t), r.release()), codes.OK, "Release of a prepared VMI")
	expectCode(t, d.Release(s.ctx(t), r.release()), codes.OK, "Release of a released VMI")
}

// checkReleaseWithoutPrepare: Release of a VMI never prepared succeeds.
func (s *storageSuite) checkReleaseWithoutPrepare(t T) {
	d, caps := s.storage(t)
	r := newRequest(t, requireSimpleVolume(t, caps, "scratch"))
	expectCode(t, d.Release(s.ctx(t), r.release()), codes.OK, "Release of a VMI never prepared")
}

// checkReleaseRemovesDisks: Release removes the disks Prepare made in the work directory.
func (s *storageSuite) checkReleaseRemovesDisks(t T) {
	d, caps := s.storage(t)
	r := newRequest(t, requireSimpleVolume(t, caps, "scratch"))
	disks := s.prepare(t, d, r)
	if err := d.Release(s.ctx(t), r.release()); err != nil {
		t.Fatalf("Release: %s", describe(err))
	}
	for _, disk := range disks {
		if !inside(r.workDir, disk.GetPath()) {
			continue
		}
		if _, err := os.Lstat(disk.GetPath()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("volume %q: %s is still there after Release", disk.GetVolumeName(), disk.GetPath())
		}
	}
}

// checkReleaseOnlyOwnFiles: Release leaves a file it did not make in the work directory, and
// the image of a hostDisk.
func (s *storageSuite) checkReleaseOnlyOwnFiles(t T) {
	d, caps := s.storage(t)
	r := newRequest(t)
	if v := simpleVolume(caps, "scratch"); v != nil {
		r.volumes = append(r.volumes, v)
	}
	var hostDisk string
	if slices.Contains(caps.GetVolumeTypes(), "hostDisk") {
		hostDisk = filepath.Join(t.TempDir(), "host.img")
		if err := os.WriteFile(hostDisk, make([]byte, 1<<16), 0o600); err != nil {
			t.Fatalf("make a host disk: %v", err)
		}
		r.volumes = append(r.volumes, &storagev1.Volume{Name: "conformance-hostdisk", Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: hostDisk, Type: "Disk"}}})
	}
	if len(r.volumes) == 0 {
		t.Skipf("driver declares none of the volume types emptyDisk, cloudInitNoCloud, hostDisk")
	}
	keep := filepath.Join(r.workDir, "conformance-keep.txt")
	content := []byte("made by the conformance kit, not by the driver\n")
	if err := os.WriteFile(keep, content, 0o600); err != nil {
		t.Fatalf("make a file in the work directory: %v", err)
	}
	s.prepare(t, d, r)
	if err := d.Release(s.ctx(t), r.release()); err != nil {
		t.Fatalf("Release: %s", describe(err))
	}
	if got, err := os.ReadFile(keep); err != nil || !bytes.Equal(got, content) {
		t.Errorf("Release removed or changed %s, which it did not make (err: %v)", keep, err)
	}
	if hostDisk != "" {
		if _, err := os.Stat(hostDisk); err != nil {
			t.Errorf("Release removed the hostDisk image %s, which it did not make: %v", hostDisk, err)
		}
	}
}
