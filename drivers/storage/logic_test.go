package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Tests in this file use the fake image tool.

func TestPrepareValidatesRequest(t *testing.T) {
	d := newFake(&fakeTool{})
	work := filepath.Join(t.TempDir(), "w")
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		req  *storagev1.PrepareRequest
		want []string
	}{
		{"no vmi", &storagev1.PrepareRequest{WorkDir: work}, []string{"vmiId: required"}},
		{"no work dir", &storagev1.PrepareRequest{VmiId: "v"}, []string{"workDir: required"}},
		{"relative work dir", &storagev1.PrepareRequest{VmiId: "v", WorkDir: "w"}, []string{"workDir: must be an absolute path"}},
		{"no name", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("", 1)}}, []string{"volumes[0].name: required"}},
		{"slash", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("../../etc/x", 1)}}, []string{`volume "../../etc/x": name cannot be used in a file name`}},
		{"backslash", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol(`a\b`, 1)}}, []string{"no path separators"}},
		{"dot dot", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("..", 1)}}, []string{`volume ".."`}},
		{"too long", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol(strings.Repeat("a", 201), 1)}}, []string{"at most 200 bytes"}},
		{"duplicate", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("a", 1), emptyDiskVol("a", 1)}}, []string{`volume "a": duplicate volume name`}},
		{"no source", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{{Name: "a"}}}, []string{`volume "a": no volume source`}},
		{"no container path", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{containerDiskVol("a", "")}}, []string{"containerDisk.path: required"}},
		{"no backing path", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{ephemeralVol("a", "")}}, []string{"ephemeral.backingPath: required"}},
		{"no pvc path", &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{pvcVol("a", "", false)}}, []string{"persistentVolumeClaim.path: required"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Prepare(ctx, tt.req)
			wantCode(t, err, codes.InvalidArgument, tt.want...)
			if exists(work) {
				t.Errorf("work dir made: %v", listDir(t, work))
			}
		})
	}
}

func TestFailedCreateUndoesTheCall(t *testing.T) {
	tool := &fakeTool{failCreate: func(p string, _ CreateOptions) error {
		if strings.HasSuffix(p, "second.qcow2.tmp") {
			return errors.New("qemu-img: second.qcow2.tmp: No space left on device")
		}
		return nil
	}}
	d := newFake(tool)
	node := t.TempDir()
	base := filepath.Join(node, "base.img")
	writeRawDisk(t, base, 1<<20)
	hostNew := filepath.Join(node, "new.img")
	work := filepath.Join(node, "w")
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{
		containerDiskVol("first", base),
		hostDiskVol("host", hostNew, "DiskOrCreate", 1<<20),
		emptyDiskVol("second", 1<<20),
	}})
	wantCode(t, err, codes.Internal, `volume "second": create empty disk: qemu-img: second.qcow2.tmp: No space left on device`)
	if exists(work) || exists(hostNew) {
		t.Errorf("left behind: %v, %v", listDir(t, work), exists(hostNew))
	}
	if tool.createCount() != 2 {
		t.Errorf("%d creates, want 2", tool.createCount())
	}
}

// A crash half way through Prepare leaves temporary files and a record that is not ready: the
// next Prepare makes the volume again, and Release removes what the crash left.
func TestRecoversFromCrash(t *testing.T) {
	tool := &fakeTool{}
	d := newFake(tool)
	work := t.TempDir()
	target := filepath.Join(work, "scratch.qcow2")
	st := &state{VMIID: "v", Volumes: []*volumeState{{Name: "scratch", Type: TypeEmptyDisk, Files: []string{target}, Source: "empty:1048576"}}}
	if err := saveState(work, st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmpPath(target), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	disks := prepare(t, d, "v", work, emptyDiskVol("scratch", 1<<20))
	if tool.createCount() != 1 || disks[0].GetSizeBytes() != 1<<20 {
		t.Errorf("creates %d, disk %v", tool.createCount(), disks[0])
	}
	if got := listDir(t, work); !slices.Equal(got, []string{stateFile, "scratch.qcow2"}) {
		t.Errorf("work dir = %v", got)
	}

	// Crash of an ISO write: its staging directory and temporary file are removed by Release.
	iso := filepath.Join(work, "ci.iso")
	st, _ = loadState(work, "v")
	st.put(&volumeState{Name: "ci", Type: TypeCloudInitNoCloud, Files: []string{iso}})
	if err := saveState(work, st); err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll(filepath.Join(tmpDir(iso), "openstack"), 0o755)
	_ = os.WriteFile(tmpPath(iso), []byte("half"), 0o644)
	release(t, d, "v", work)
	if got := listDir(t, work); len(got) != 0 {
		t.Errorf("work dir after Release = %v", got)
	}
}

func TestFileNotOursAtOurName(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	theirs := filepath.Join(work, "scratch.qcow2")
	if err := os.WriteFile(theirs, []byte("someone else's"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("scratch", 1<<20)}})
	wantCode(t, err, codes.FailedPrecondition, `volume "scratch"`, theirs+" exists and was not made by the local storage driver")
	if b, _ := os.ReadFile(theirs); string(b) != "someone else's" {
		t.Error("the file was changed")
	}
	release(t, d, "v", work)
	if !exists(theirs) {
		t.Error("Release removed a file the driver did not make")
	}
}

func TestWorkDirOfAnotherVMI(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	prepare(t, d, "vmi-a", work, emptyDiskVol("e", 1<<20))
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "vmi-b", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("e", 1<<20)}})
	wantCode(t, err, codes.FailedPrecondition, `holds the volumes of VMI "vmi-a", not "vmi-b"`)
	err = d.Release(context.Background(), &storagev1.ReleaseRequest{VmiId: "vmi-b", WorkDir: work})
	wantCode(t, err, codes.FailedPrecondition)
	if !exists(filepath.Join(work, "e.qcow2")) {
		t.Error("another VMI's Release removed the disk")
	}
}

func TestReleaseWithoutPrepare(t *testing.T) {
	d := newFake(&fakeTool{})
	for _, work := range []string{t.TempDir(), filepath.Join(t.TempDir(), "missing")} {
		release(t, d, "v", work)
	}
}

func TestQcow2ToolChecks(t *testing.T) {
	node := t.TempDir()
	q := filepath.Join(node, "x.qcow2")
	if err := os.WriteFile(q, qcow2Bytes(3, 1<<30, false, false), 0o644); err != nil {
		t.Fatal(err)
	}
	corrupt := &failingInfo{err: errors.New("qemu-img: Could not open 'x.qcow2': Image is corrupt")}
	d := New(nil, WithImageTool(func(string) ImageTool { return corrupt }))
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: t.TempDir(), Volumes: []*storagev1.Volume{containerDiskVol("root", q)}})
	wantCode(t, err, codes.InvalidArgument, `volume "root": `+q+" is not a usable qcow2 image: qemu-img: Could not open")

	missing := &failingInfo{err: fmt.Errorf("%w: exec: not found", ErrToolUnavailable)}
	d = New(nil, WithImageTool(func(string) ImageTool { return missing }))
	_, err = d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: t.TempDir(), Volumes: []*storagev1.Volume{hostDiskVol("h", q, "Disk", 0)}})
	wantCode(t, err, codes.FailedPrecondition, `volume "h"`, "image tool unavailable")

	backed := &failingInfo{info: &ImageInfo{Format: FormatQcow2, VirtualSize: 1 << 30, BackingFile: "/etc/shadow"}}
	d = New(nil, WithImageTool(func(string) ImageTool { return backed }))
	_, err = d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: t.TempDir(), Volumes: []*storagev1.Volume{pvcVol("p", q, false)}})
	wantCode(t, err, codes.InvalidArgument, `volume "p"`, "backing file, which is not allowed")
}

type failingInfo struct {
	fakeTool
	err  error
	info *ImageInfo
}

func (f *failingInfo) Info(context.Context, string, Format) (*ImageInfo, error) { return f.info, f.err }

func TestCanceledPrepare(t *testing.T) {
	d := newFake(&fakeTool{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	work := filepath.Join(t.TempDir(), "w")
	_, err := d.Prepare(ctx, &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("e", 1<<20)}})
	wantCode(t, err, codes.Canceled)
	if exists(work) {
		t.Error("work dir made")
	}
}

func TestStateFileIsAtomicJSON(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	prepare(t, d, "v", work, emptyDiskVol("e", 1<<20), noCloudVol("ci", &storagev1.CloudInit{}))
	raw, err := os.ReadFile(filepath.Join(work, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.VMIID != "v" || len(st.Volumes) != 2 || !st.Volumes[0].Ready || st.Volumes[1].Files[0] != filepath.Join(work, "ci.iso") {
		t.Errorf("state = %s", raw)
	}
	if exists(filepath.Join(work, stateFile+".tmp")) {
		t.Error("temporary state file left")
	}
}

func TestFingerprintFake(t *testing.T) {
	tool := &fakeTool{version: "8.2.1"}
	d := newFake(tool)
	ctx, cancel := context.WithCancel(context.Background())
	var got []*basev1.FingerprintResponse
	err := d.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error {
		got = append(got, r)
		cancel()
		return nil
	})
	if err != nil || len(got) != 1 || got[0].GetHealth() != basev1.Health_HEALTH_HEALTHY || got[0].GetAttributes()["qemu-img"] != "8.2" {
		t.Fatalf("fingerprint = %v, %v", got, err)
	}

	tool.versionErr = errors.New("exec: \"qemu-img\": executable file not found in $PATH")
	ctx, cancel = context.WithCancel(context.Background())
	got = nil
	_ = d.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error { got = append(got, r); cancel(); return nil })
	if got[0].GetHealth() != basev1.Health_HEALTH_UNHEALTHY || !strings.Contains(got[0].GetHealthDescription(), "install qemu-utils") {
		t.Errorf("fingerprint = %v", got[0])
	}
	if errors.Is(context.Cause(ctx), context.Canceled) && len(got) != 1 {
		t.Errorf("%d fingerprints", len(got))
	}
}

// recordingLogger keeps the messages the driver logs.
type recordingLogger struct{ msgs []string }

func (l *recordingLogger) Info(msg string, _ ...any) { l.msgs = append(l.msgs, msg) }
func (l *recordingLogger) Warn(msg string, _ ...any) { l.msgs = append(l.msgs, msg) }

func pvcSizedVol(name, p string, ro bool, capacity int64) *storagev1.Volume {
	v := pvcVol(name, p, ro)
	v.GetPersistentVolumeClaim().CapacityBytes = capacity
	return v
}

// A file-system claim without disk.img gets a sparse raw one of its capacity rounded down to
// whole MiB, 0660, said in the log, kept by Release and not made again by a second Prepare;
// none is made on a read-only claim or without a capacity; a disk.img that exists is used as
// it is, whatever the capacity.
func TestClaimDiskImageMade(t *testing.T) {
	log := &recordingLogger{}
	d := New(log, WithImageTool(func(string) ImageTool { return &fakeTool{} }))
	claim := t.TempDir()
	img := filepath.Join(claim, "disk.img")
	work := filepath.Join(t.TempDir(), "w")
	const capacity = 100<<20 + 12345 // rounded down to 100 MiB
	disks := prepare(t, d, "v", work, pvcSizedVol("data", claim, false, capacity))
	want := &storagev1.PreparedDisk{VolumeName: "data", Path: img, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: 100 << 20}
	if len(disks) != 1 || !proto.Equal(disks[0], want) {
		t.Fatalf("disks %v, want %v", disks, want)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 100<<20 {
		t.Errorf("disk.img is %d bytes, want %d", fi.Size(), 100<<20)
	}
	if b := blocks(fi); b*512 > 1<<20 {
		t.Errorf("disk.img takes %d bytes on disk: not sparse", b*512)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Errorf("disk.img mode %v, want 0660", fi.Mode().Perm())
	}
	if !slices.ContainsFunc(log.msgs, func(m string) bool { return strings.Contains(m, "disk.img") && strings.Contains(m, "created") }) {
		t.Errorf("the log %q does not say disk.img was created", log.msgs)
	}
	// Written by the guest, then prepared again: used as it is, not made again.
	if err := os.WriteFile(img, []byte("guest data"), 0o660); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 100<<20); err != nil {
		t.Fatal(err)
	}
	before := inode(t, img)
	prepare(t, d, "v", work, pvcSizedVol("data", claim, false, capacity))
	release(t, d, "v", work)
	if !exists(img) || inode(t, img) != before {
		t.Fatal("Prepare again or Release replaced or removed the claim's disk.img")
	}
	if data, _ := os.ReadFile(img); !strings.HasPrefix(string(data), "guest data") {
		t.Error("the claim's disk.img lost its data")
	}

	// An existing disk.img of another size is used as it is.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "disk.img"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	disks = prepare(t, d, "v2", filepath.Join(t.TempDir(), "w"), pvcSizedVol("kept", other, false, 64<<20))
	if disks[0].GetSizeBytes() != 2<<20 {
		t.Errorf("an existing disk.img: size %d, want its own 2 MiB", disks[0].GetSizeBytes())
	}
	if fi, _ := os.Stat(filepath.Join(other, "disk.img")); fi.Size() != 2<<20 {
		t.Errorf("an existing disk.img changed size to %d", fi.Size())
	}

	for _, tt := range []struct {
		name string
		vol  *storagev1.Volume
		want string
	}{
		{"read-only", pvcSizedVol("ro", t.TempDir(), true, 64<<20), "the claim is read-only"},
		{"no capacity", pvcSizedVol("nocap", t.TempDir(), false, 0), "no capacity"},
		{"under a MiB", pvcSizedVol("tiny", t.TempDir(), false, 4096), "less than 1 MiB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			claim := tt.vol.GetPersistentVolumeClaim().GetPath()
			_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v3", WorkDir: filepath.Join(t.TempDir(), "w"), Volumes: []*storagev1.Volume{tt.vol}})
			wantCode(t, err, codes.InvalidArgument, "is a directory without disk.img", tt.want)
			if exists(filepath.Join(claim, "disk.img")) {
				t.Error("disk.img made")
			}
		})
	}
}

// A failed Prepare removes the disk.img it made on a claim: no guest used it yet.
func TestClaimDiskImageUndone(t *testing.T) {
	tool := &fakeTool{failCreate: func(string, CreateOptions) error { return errors.New("qemu-img: No space left on device") }}
	d := newFake(tool)
	claim := t.TempDir()
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: filepath.Join(t.TempDir(), "w"),
		Volumes: []*storagev1.Volume{pvcSizedVol("data", claim, false, 8<<20), emptyDiskVol("scratch", 1<<20)}})
	if err == nil {
		t.Fatal("Prepare with a failing emptyDisk: no error")
	}
	if exists(filepath.Join(claim, "disk.img")) {
		t.Error("a failed Prepare left the disk.img it made on the claim")
	}
}
