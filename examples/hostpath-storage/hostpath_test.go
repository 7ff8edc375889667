package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

const gib = 1 << 30

// newClient serves a fresh driver over in-process gRPC, as the host would reach it, so status
// codes and messages are checked as they cross the plugin boundary.
func newClient(t *testing.T) driver.Storage {
	t.Helper()
	c, stop, err := driver.InProcess(basev1.Kind_KIND_STORAGE, New(nil))
	if err != nil {
		t.Fatalf("serve driver: %v", err)
	}
	t.Cleanup(stop)
	return c.(driver.Storage)
}

func emptyDisk(name string, capacity uint64) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: capacity}}}
}

func hostDisk(name, path, typ string, capacity uint64) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: path, Type: typ, CapacityBytes: capacity}}}
}

func prepare(t *testing.T, c driver.Storage, vmi, workDir string, vols ...*storagev1.Volume) []*storagev1.PreparedDisk {
	t.Helper()
	resp, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: vmi, WorkDir: workDir, Volumes: vols})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return resp.GetDisks()
}

func release(t *testing.T, c driver.Storage, vmi, workDir string, vols ...*storagev1.Volume) {
	t.Helper()
	if err := c.Release(t.Context(), &storagev1.ReleaseRequest{VmiId: vmi, WorkDir: workDir, Volumes: vols}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// wantStatus fails unless err has the code and its message contains every one of want.
func wantStatus(t *testing.T, err error, code codes.Code, want ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", status.Code(err), err, code)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("message %q does not contain %q", status.Convert(err).Message(), w)
		}
	}
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// entries lists dir, nil when it does not exist.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// readHead returns the first n bytes of a file.
func readHead(t *testing.T, path string, n int) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(f, buf); err != nil {
		t.Fatal(err)
	}
	return string(buf)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestInfoAndCapabilities(t *testing.T) {
	c := newClient(t)
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.GetName() != DriverName || info.GetKind() != basev1.Kind_KIND_STORAGE || info.GetVersion() == "" {
		t.Errorf("Info = %v, want name %q, kind storage and a version", info, DriverName)
	}
	if !slices.Contains(info.GetProtocolVersions(), driver.ProtocolVersion) {
		t.Errorf("protocol versions %v do not include %d", info.GetProtocolVersions(), driver.ProtocolVersion)
	}
	caps, err := c.Capabilities(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := caps.GetVolumeTypes(), []string{"emptyDisk", "hostDisk"}; !slices.Equal(got, want) {
		t.Errorf("volume types = %v, want %v", got, want)
	}
	if len(caps.GetFeatures()) != 0 {
		t.Errorf("features = %v, want none", caps.GetFeatures())
	}
}

func TestFingerprint(t *testing.T) {
	c := newClient(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var got []*basev1.FingerprintResponse
	err := c.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error {
		got = append(got, r)
		cancel()
		return nil
	})
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("got %d fingerprints, want 1", len(got))
	}
	fp := got[0]
	if fp.GetHealth() != basev1.Health_HEALTH_HEALTHY {
		t.Errorf("health = %v, want healthy", fp.GetHealth())
	}
	if fp.GetAttributes()["example"] != "true" {
		t.Errorf("attributes = %v, want example=true", fp.GetAttributes())
	}
	labelPart := regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	for k, v := range fp.GetAttributes() {
		if k == "" || !labelPart.MatchString(k) || !labelPart.MatchString(v) {
			t.Errorf("attribute %q=%q is not label-safe", k, v)
		}
	}
}

func TestConfigure(t *testing.T) {
	c := newClient(t)
	root := t.TempDir()
	for _, tc := range []struct {
		name   string
		config string
		code   codes.Code
		want   string
	}{
		{name: "empty means defaults", config: ""},
		{name: "empty object", config: "{}"},
		{name: "root", config: `{"root": "` + root + `"}`},
		{name: "same again", config: `{"root": "` + root + `"}`},
		{name: "relative root", config: `{"root": "var/lib"}`, code: codes.InvalidArgument, want: "config.root"},
		{name: "unknown field", config: `{"rot": "/x"}`, code: codes.InvalidArgument, want: "rot"},
		{name: "not JSON", config: `root=/x`, code: codes.InvalidArgument, want: "config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(tc.config)})
			wantStatus(t, err, tc.code, tc.want)
		})
	}
}

func TestPrepareEmptyDisk(t *testing.T) {
	c := newClient(t)
	work := filepath.Join(t.TempDir(), "vmi")
	disks := prepare(t, c, "vmi-1", work, emptyDisk("scratch", gib))

	if len(disks) != 1 {
		t.Fatalf("got %d disks, want 1", len(disks))
	}
	d := disks[0]
	if d.GetVolumeName() != "scratch" || d.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW || d.GetSizeBytes() != gib || d.GetReadOnly() || d.GetCdrom() {
		t.Errorf("disk = %v, want scratch, raw, %d bytes, writable", d, gib)
	}
	if filepath.Dir(d.GetPath()) != work {
		t.Errorf("path %s is not in the work dir %s", d.GetPath(), work)
	}
	fi, err := os.Stat(d.GetPath())
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != gib {
		t.Errorf("file is %v of %d bytes, want a regular file of %d", fi.Mode(), fi.Size(), gib)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 >= gib {
		t.Errorf("file uses %d bytes on disk, want a sparse file", st.Blocks*512)
	}
}

func TestPrepareIsIdempotent(t *testing.T) {
	c := newClient(t)
	tmp := t.TempDir()
	work := filepath.Join(tmp, "vmi")
	created := filepath.Join(tmp, "created.img")
	vols := []*storagev1.Volume{emptyDisk("scratch", gib), hostDisk("data", created, "DiskOrCreate", gib)}

	first := prepare(t, c, "vmi-1", work, vols...)
	// The guest writes; a second Prepare must neither lose that nor change the answer.
	writeFile(t, first[0].GetPath(), "guest data")
	if err := os.Truncate(first[0].GetPath(), gib); err != nil {
		t.Fatal(err)
	}
	second := prepare(t, c, "vmi-1", work, vols...)

	if len(first) != len(second) {
		t.Fatalf("second Prepare returned %d disks, the first %d", len(second), len(first))
	}
	for i := range first {
		if first[i].String() != second[i].String() {
			t.Errorf("disk %d: first %v, second %v", i, first[i], second[i])
		}
	}
	if got := readHead(t, first[0].GetPath(), len("guest data")); got != "guest data" {
		t.Errorf("second Prepare changed the disk's contents")
	}

	release(t, c, "vmi-1", work, vols...)
	if exists(t, created) || exists(t, work) {
		t.Errorf("Release left %v", slices.DeleteFunc([]string{created, work}, func(p string) bool { return !exists(t, p) }))
	}
}

func TestHostDiskDisk(t *testing.T) {
	c := newClient(t)
	tmp := t.TempDir()
	work := filepath.Join(tmp, "vmi")
	image := filepath.Join(tmp, "image.raw")
	writeFile(t, image, "0123456789")

	disks := prepare(t, c, "vmi-1", work, hostDisk("root", image, "Disk", 0))
	if len(disks) != 1 || disks[0].GetPath() != image || disks[0].GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW || disks[0].GetSizeBytes() != 10 {
		t.Fatalf("disks = %v, want %s, raw, 10 bytes", disks, image)
	}
	release(t, c, "vmi-1", work)
	if !exists(t, image) {
		t.Error("Release removed a hostDisk of type Disk")
	}

	for _, tc := range []struct {
		name string
		vol  *storagev1.Volume
		want []string
	}{
		{"missing", hostDisk("root", filepath.Join(tmp, "nope.img"), "Disk", 0), []string{`volume "root"`, "volumes[0].hostDisk.path", "does not exist"}},
		{"directory", hostDisk("root", tmp, "Disk", 0), []string{`volume "root"`, "not a regular file"}},
		{"relative path", hostDisk("root", "image.raw", "Disk", 0), []string{`volume "root"`, "absolute"}},
		{"unknown type", hostDisk("root", image, "File", 0), []string{`volume "root"`, "volumes[0].hostDisk.type", `"File"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := filepath.Join(tmp, "work-"+strings.ReplaceAll(tc.name, " ", "-"))
			_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-2", WorkDir: work, Volumes: []*storagev1.Volume{tc.vol}})
			wantStatus(t, err, codes.InvalidArgument, tc.want...)
			if exists(t, work) {
				t.Errorf("a failed Prepare left %s", work)
			}
		})
	}
}

func TestHostDiskDiskOrCreate(t *testing.T) {
	c := newClient(t)
	tmp := t.TempDir()
	work := filepath.Join(tmp, "vmi")
	created := filepath.Join(tmp, "created.img")
	existing := filepath.Join(tmp, "existing.img")
	writeFile(t, existing, "keep me")
	vols := []*storagev1.Volume{
		hostDisk("new", created, "DiskOrCreate", gib),
		hostDisk("old", existing, "DiskOrCreate", gib),
	}

	disks := prepare(t, c, "vmi-1", work, vols...)
	if disks[0].GetPath() != created || disks[0].GetSizeBytes() != gib {
		t.Errorf("disk 0 = %v, want %s of %d bytes", disks[0], created, gib)
	}
	if disks[1].GetPath() != existing || disks[1].GetSizeBytes() != uint64(len("keep me")) {
		t.Errorf("disk 1 = %v, want %s as it is", disks[1], existing)
	}
	if fi, err := os.Stat(created); err != nil || fi.Size() != gib {
		t.Fatalf("created image: %v, %v", fi, err)
	}

	release(t, c, "vmi-1", work, vols...)
	if exists(t, created) {
		t.Error("Release kept the image Prepare created")
	}
	if !exists(t, existing) {
		t.Error("Release removed an image Prepare did not create")
	}

	t.Run("no capacity", func(t *testing.T) {
		_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-2", WorkDir: work,
			Volumes: []*storagev1.Volume{hostDisk("new", created, "DiskOrCreate", 0)}})
		wantStatus(t, err, codes.InvalidArgument, `volume "new"`, "capacityBytes")
	})
	t.Run("no directory", func(t *testing.T) {
		_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-2", WorkDir: work,
			Volumes: []*storagev1.Volume{hostDisk("new", filepath.Join(tmp, "no", "dir.img"), "DiskOrCreate", gib)}})
		wantStatus(t, err, codes.InvalidArgument, `volume "new"`, "directory")
	})
}

func TestUnsupportedVolumes(t *testing.T) {
	c := newClient(t)
	work := filepath.Join(t.TempDir(), "vmi")
	for _, tc := range []struct {
		name string
		vol  *storagev1.Volume
		want []string
	}{
		{"containerDisk", &storagev1.Volume{Name: "boot", Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "quay.io/x"}}},
			[]string{"volumes[1]", `volume "boot"`, "containerDisk", "not supported"}},
		{"cloudInitNoCloud", &storagev1.Volume{Name: "ci", Source: &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: &storagev1.CloudInit{}}},
			[]string{`volume "ci"`, "cloudInitNoCloud", "not supported"}},
		{"no source", &storagev1.Volume{Name: "void"}, []string{`volume "void"`, "no volume source"}},
		{"no name", emptyDisk("", gib), []string{"volumes[1].name", "required"}},
		{"name with a slash", emptyDisk("../x", gib), []string{"volumes[1].name", `volume "../x"`}},
		{"duplicate name", emptyDisk("scratch", gib), []string{"volumes[1].name", "duplicate"}},
		{"no capacity", emptyDisk("e", 0), []string{"volumes[1].emptyDisk.capacityBytes", `volume "e"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-1", WorkDir: work,
				Volumes: []*storagev1.Volume{emptyDisk("scratch", gib), tc.vol}})
			wantStatus(t, err, codes.InvalidArgument, tc.want...)
			if exists(t, work) {
				t.Errorf("a rejected Prepare left %v in %s", entries(t, work), work)
			}
		})
	}
}

func TestRequestValidation(t *testing.T) {
	c := newClient(t)
	vols := []*storagev1.Volume{emptyDisk("scratch", gib)}
	for _, tc := range []struct {
		name, vmi, work, want string
	}{
		{"no vmi id", "", t.TempDir(), "vmiId"},
		{"no work dir", "vmi-1", "", "workDir"},
		{"relative work dir", "vmi-1", "work", "workDir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: tc.vmi, WorkDir: tc.work, Volumes: vols})
			wantStatus(t, err, codes.InvalidArgument, tc.want)
			err = c.Release(t.Context(), &storagev1.ReleaseRequest{VmiId: tc.vmi, WorkDir: tc.work, Volumes: vols})
			wantStatus(t, err, codes.InvalidArgument, tc.want)
		})
	}
}

func TestPrepareUndoesAFailedHalfPrepare(t *testing.T) {
	c := newClient(t)
	tmp := t.TempDir()
	work := filepath.Join(tmp, "vmi")
	created := filepath.Join(tmp, "created.img")

	// "b.img" is in the way as a directory: planning passes, making the file fails after
	// "a" and the hostDisk were made.
	if err := os.MkdirAll(filepath.Join(work, "b.img"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-1", WorkDir: work, Volumes: []*storagev1.Volume{
		emptyDisk("a", gib), hostDisk("h", created, "DiskOrCreate", gib), emptyDisk("b", gib),
	}})
	wantStatus(t, err, codes.FailedPrecondition, `volume "b"`)
	if got := entries(t, work); !slices.Equal(got, []string{"b.img"}) {
		t.Errorf("work dir holds %v after a failed Prepare, want only what was there before", got)
	}
	if exists(t, created) {
		t.Error("a failed Prepare left the hostDisk it created")
	}

	// A failure in a later call removes only what that call made.
	if err := os.Remove(filepath.Join(work, "b.img")); err != nil {
		t.Fatal(err)
	}
	first := prepare(t, c, "vmi-1", work, emptyDisk("a", gib))
	if err := os.Mkdir(filepath.Join(work, "b.img"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-1", WorkDir: work, Volumes: []*storagev1.Volume{
		emptyDisk("a", gib), emptyDisk("c", gib), emptyDisk("b", gib),
	}})
	wantStatus(t, err, codes.FailedPrecondition, `volume "b"`)
	if !exists(t, first[0].GetPath()) || exists(t, filepath.Join(work, "c.img")) {
		t.Errorf("after a failed second Prepare the work dir holds %v, want a.img kept and c.img gone", entries(t, work))
	}
	release(t, c, "vmi-1", work)
	if got := entries(t, work); !slices.Equal(got, []string{"b.img"}) {
		t.Errorf("work dir holds %v after Release, want only b.img", got)
	}
}

func TestReleaseRemovesOnlyWhatPrepareMade(t *testing.T) {
	c := newClient(t)
	tmp := t.TempDir()
	work := filepath.Join(tmp, "vmi")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(work, "foreign.txt")
	writeFile(t, foreign, "not the driver's")
	image := filepath.Join(tmp, "image.raw")
	writeFile(t, image, "disk")
	vols := []*storagev1.Volume{emptyDisk("scratch", gib), hostDisk("root", image, "Disk", 0)}

	disks := prepare(t, c, "vmi-1", work, vols...)
	release(t, c, "vmi-1", work, vols...)
	release(t, c, "vmi-1", work, vols...) // twice

	if exists(t, disks[0].GetPath()) {
		t.Error("Release kept the emptyDisk")
	}
	if got := entries(t, work); !slices.Equal(got, []string{"foreign.txt"}) {
		t.Errorf("work dir holds %v after Release, want only foreign.txt", got)
	}
	if !exists(t, image) {
		t.Error("Release removed a hostDisk it did not create")
	}

	// Release of a VMI that was never prepared succeeds and touches nothing.
	release(t, c, "vmi-2", filepath.Join(tmp, "never"))
	release(t, c, "vmi-1", work)
}

func TestEmptyDiskPathTakenByAnotherFile(t *testing.T) {
	c := newClient(t)
	work := t.TempDir()
	writeFile(t, filepath.Join(work, "scratch.img"), "someone else's")
	_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-1", WorkDir: work, Volumes: []*storagev1.Volume{emptyDisk("scratch", gib)}})
	wantStatus(t, err, codes.FailedPrecondition, `volume "scratch"`)
	if got := entries(t, work); !slices.Equal(got, []string{"scratch.img"}) {
		t.Errorf("work dir holds %v, want only scratch.img", got)
	}
}

func TestWorkDirOfAnotherVMI(t *testing.T) {
	c := newClient(t)
	work := filepath.Join(t.TempDir(), "vmi")
	prepare(t, c, "vmi-1", work, emptyDisk("scratch", gib))
	_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "vmi-2", WorkDir: work, Volumes: []*storagev1.Volume{emptyDisk("scratch", gib)}})
	wantStatus(t, err, codes.FailedPrecondition, "vmi-1")
}

func TestConfiguredRoot(t *testing.T) {
	c := newClient(t)
	root := t.TempDir()
	if err := c.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(`{"root": "` + root + `"}`)}); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(t.TempDir(), "unused")
	disks := prepare(t, c, "vmi-1", work, emptyDisk("scratch", gib))
	if want := filepath.Join(root, "vmi-1", "scratch.img"); disks[0].GetPath() != want {
		t.Errorf("path = %s, want %s", disks[0].GetPath(), want)
	}
	if exists(t, work) {
		t.Error("with a root configured, Prepare used the work dir")
	}
	release(t, c, "vmi-1", work)
	if got := entries(t, root); len(got) != 0 {
		t.Errorf("root holds %v after Release, want nothing", got)
	}

	_, err := c.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "..", WorkDir: work, Volumes: []*storagev1.Volume{emptyDisk("scratch", gib)}})
	wantStatus(t, err, codes.InvalidArgument, "vmiId")
}

func TestPrepareResumesAShortFileOnRecord(t *testing.T) {
	c := newClient(t)
	work := filepath.Join(t.TempDir(), "vmi")
	disks := prepare(t, c, "vmi-1", work, emptyDisk("scratch", gib))
	// As if a Prepare crashed between creating the file and sizing it.
	if err := os.Truncate(disks[0].GetPath(), 0); err != nil {
		t.Fatal(err)
	}
	disks = prepare(t, c, "vmi-1", work, emptyDisk("scratch", gib))
	if fi, err := os.Stat(disks[0].GetPath()); err != nil || fi.Size() != gib || disks[0].GetSizeBytes() != gib {
		t.Errorf("after a second Prepare: %v, %v; disk %v", fi, err, disks[0])
	}
}
