package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Tests in this file run the real qemu-img (and qemu-io): they fail when qemu-utils is
// missing.

type qemuInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	BackingFormat   string `json:"backing-filename-format"`
}

func imgInfo(t *testing.T, p string) qemuInfo {
	t.Helper()
	var info qemuInfo
	if err := json.Unmarshal([]byte(run(t, requireTool(t, "qemu-img"), "info", "-U", "--output=json", p)), &info); err != nil {
		t.Fatal(err)
	}
	return info
}

func newReal(t *testing.T) *Local {
	t.Helper()
	requireTool(t, "qemu-img")
	requireTool(t, "qemu-io")
	return New(nil)
}

type fileState struct {
	sum   string
	mtime time.Time
}

func stateOf(t *testing.T, p string) fileState {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fileState{sha256File(t, p), fi.ModTime()}
}

// writeGuestData writes through an overlay as a guest would, and checks it reads back.
func writeGuestData(t *testing.T, overlay string) {
	t.Helper()
	qemuIO := requireTool(t, "qemu-io")
	run(t, qemuIO, "-f", "qcow2", "-c", "write -P 0xab 0 64k", overlay)
	if out := run(t, qemuIO, "-f", "qcow2", "-c", "read -P 0xab 0 64k", overlay); strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("read back through overlay: %s", out)
	}
}

func TestRealContainerDiskRawFile(t *testing.T) {
	d := newReal(t)
	base := filepath.Join(t.TempDir(), "fedora.img")
	writeRawDisk(t, base, 4<<20)
	before := stateOf(t, base)
	time.Sleep(10 * time.Millisecond) // an mtime change would show

	work := filepath.Join(t.TempDir(), "vmi-a")
	disks := prepare(t, d, "vmi-a", work, containerDiskVol("rootdisk", base))
	want := &storagev1.PreparedDisk{VolumeName: "rootdisk", Path: filepath.Join(work, "rootdisk.qcow2"), Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, SizeBytes: 4 << 20}
	if !proto.Equal(disks[0], want) {
		t.Fatalf("disk = %v, want %v", disks[0], want)
	}
	info := imgInfo(t, want.Path)
	if info.Format != "qcow2" || info.BackingFilename != base || info.BackingFormat != "raw" || info.VirtualSize != 4<<20 {
		t.Errorf("overlay info = %+v, want qcow2 over raw %s", info, base)
	}
	writeGuestData(t, want.Path)
	if after := stateOf(t, base); after != before {
		t.Errorf("base changed after the guest wrote to the overlay: %+v → %+v", before, after)
	}
	release(t, d, "vmi-a", work)
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("work dir made by Prepare left after Release: %v", err)
	}
	if after := stateOf(t, base); after != before {
		t.Error("base changed by Release")
	}
}

func TestRealContainerDiskQcow2UnpackedImage(t *testing.T) {
	d := newReal(t)
	img := t.TempDir()
	if err := os.Mkdir(filepath.Join(img, "disk"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(img, "disk", "cirros.qcow2")
	run(t, requireTool(t, "qemu-img"), "create", "-q", "-f", "qcow2", base, "64M")
	run(t, requireTool(t, "qemu-io"), "-f", "qcow2", "-c", "write -P 0x11 0 1M", base)
	before := stateOf(t, base)

	work := t.TempDir()
	disks := prepare(t, d, "vmi-b", work, containerDiskVol("root", img))
	if disks[0].GetSizeBytes() != 64<<20 || disks[0].GetFormat() != domainv1.DiskFormat_DISK_FORMAT_QCOW2 {
		t.Errorf("disk = %v", disks[0])
	}
	info := imgInfo(t, disks[0].GetPath())
	if info.BackingFilename != base || info.BackingFormat != "qcow2" {
		t.Errorf("overlay info = %+v, want backing %s (qcow2)", info, base)
	}
	writeGuestData(t, disks[0].GetPath())
	// The base's data shows through where the guest did not write.
	if out := run(t, "qemu-io", "-f", "qcow2", "-c", "read -P 0x11 512k 64k", disks[0].GetPath()); strings.Contains(out, "failed") {
		t.Errorf("base data not seen through the overlay: %s", out)
	}
	if after := stateOf(t, base); after != before {
		t.Error("base changed after the guest wrote to the overlay")
	}
}

func TestRealContainerDiskOCILayout(t *testing.T) {
	for _, compression := range []string{"gzip", "zstd", ""} {
		t.Run("compression="+compression, func(t *testing.T) {
			d := newReal(t)
			src := filepath.Join(t.TempDir(), "src.qcow2")
			run(t, requireTool(t, "qemu-img"), "create", "-q", "-f", "qcow2", src, "32M")
			run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x22 0 128k", src)
			content, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			layout := t.TempDir()
			writeOCILayout(t, layout, compression,
				[]tarEntry{{name: "etc/", dir: true}, {name: "etc/os-release", data: []byte("ID=scratch\n")}},
				[]tarEntry{{name: "disk/", dir: true}, {name: "disk/disk.qcow2", data: content}})
			layoutBefore := listTree(t, layout)

			work := t.TempDir()
			disks := prepare(t, d, "vmi-c", work, containerDiskVol("root", layout))
			extracted := filepath.Join(work, "root.base")
			if got := sha256File(t, extracted); got != sha256File(t, src) {
				t.Error("extracted disk differs from the image's")
			}
			if disks[0].GetSizeBytes() != 32<<20 || disks[0].GetPath() != filepath.Join(work, "root.qcow2") {
				t.Errorf("disk = %v", disks[0])
			}
			info := imgInfo(t, disks[0].GetPath())
			if info.BackingFilename != extracted || info.BackingFormat != "qcow2" {
				t.Errorf("overlay info = %+v, want backing %s", info, extracted)
			}
			writeGuestData(t, disks[0].GetPath())
			if got := sha256File(t, extracted); got != sha256File(t, src) {
				t.Error("extracted base changed after the guest wrote to the overlay")
			}
			// Prepare again: nothing is extracted or made again.
			baseIno, ovIno := inode(t, extracted), inode(t, disks[0].GetPath())
			again := prepare(t, d, "vmi-c", work, containerDiskVol("root", layout))
			if !proto.Equal(again[0], disks[0]) || inode(t, extracted) != baseIno || inode(t, disks[0].GetPath()) != ovIno {
				t.Error("second Prepare made the files again")
			}
			release(t, d, "vmi-c", work)
			if got := listDir(t, work); len(got) != 0 {
				t.Errorf("work dir after Release: %v", got)
			}
			if !slices.Equal(listTree(t, layout), layoutBefore) {
				t.Error("the OCI layout changed")
			}
		})
	}
}

func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %d %d", p, fi.Size(), fi.ModTime().UnixNano()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRealContainerDiskNotADisk(t *testing.T) {
	d := newReal(t)
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("not a disk\n", 1024)), 0o644); err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(dir, "odd.img")
	if err := os.WriteFile(odd, append(make([]byte, 510), 0x55, 0xaa, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.img")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	badQcow2 := filepath.Join(dir, "bad.qcow2")
	if err := os.WriteFile(badQcow2, append(qcow2Bytes(3, 1<<30, false, false), make([]byte, 64<<10)...), 0o644); err != nil {
		t.Fatal(err)
	}
	withBacking := filepath.Join(dir, "backed.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/hostname", "-u", withBacking, "1M")
	emptyUnpacked := t.TempDir()
	_ = os.Mkdir(filepath.Join(emptyUnpacked, "disk"), 0o755)
	noDiskLayout := t.TempDir()
	writeOCILayout(t, noDiskLayout, "gzip", []tarEntry{{name: "etc/os-release", data: []byte("x")}})

	for _, tt := range []struct {
		name, path string
		want       []string
	}{
		{"text", text, []string{text + " is not a disk image: no partition table, filesystem or qcow2 header"}},
		{"odd size", odd, []string{"513 bytes, is not a multiple of 512"}},
		{"zero length", empty, []string{empty + " is empty"}},
		{"corrupt qcow2", badQcow2, []string{"is not a usable qcow2 image", "qemu-img"}},
		{"qcow2 with backing file", withBacking, []string{"backing file, which is not allowed"}},
		{"missing", filepath.Join(dir, "missing"), []string{"does not exist"}},
		{"empty disk dir", emptyUnpacked, []string{"holds no disk image file"}},
		{"OCI without disk", noDiskLayout, []string{"has no file under /disk/"}},
		{"relative", "disk.img", []string{"containerDisk.path: must be an absolute path"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			work := filepath.Join(t.TempDir(), "w")
			_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{containerDiskVol("rootdisk", tt.path)}})
			wantCode(t, err, codes.InvalidArgument, append([]string{`volume "rootdisk": `}, tt.want...)...)
			if _, err := os.Stat(work); !os.IsNotExist(err) {
				t.Errorf("work dir left behind: %v", listDir(t, work))
			}
		})
	}
}

func TestRealEmptyDisk(t *testing.T) {
	d := newReal(t)
	work := t.TempDir()
	disks := prepare(t, d, "v", work, emptyDiskVol("scratch", 10<<30), emptyDiskVol("odd", 1000))
	if disks[0].GetSizeBytes() != 10<<30 || disks[0].GetFormat() != domainv1.DiskFormat_DISK_FORMAT_QCOW2 || disks[0].GetReadOnly() {
		t.Errorf("disk = %v", disks[0])
	}
	info := imgInfo(t, disks[0].GetPath())
	if info.Format != "qcow2" || info.VirtualSize != 10<<30 || info.BackingFilename != "" {
		t.Errorf("info = %+v", info)
	}
	if got := imgInfo(t, disks[1].GetPath()).VirtualSize; got != 1024 || disks[1].GetSizeBytes() != 1024 {
		t.Errorf("1000 bytes asked: qemu-img made %d, Prepare says %d", got, disks[1].GetSizeBytes())
	}
	fi, _ := os.Stat(disks[0].GetPath())
	if fi.Size() > 1<<20 {
		t.Errorf("a 10 GiB empty disk takes %d bytes", fi.Size())
	}
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{emptyDiskVol("nocap", 0)}})
	wantCode(t, err, codes.InvalidArgument, `volume "nocap"`, "emptyDisk.capacityBytes: required")
}

func TestRealQemuImgErrorNamesVolume(t *testing.T) {
	d := newReal(t)
	base := filepath.Join(t.TempDir(), "base.img")
	writeRawDisk(t, base, 1<<20)
	work := filepath.Join(t.TempDir(), "w")
	// qemu-img refuses a qcow2 this large: it fails after the first volume was made.
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{
		containerDiskVol("first", base),
		emptyDiskVol("huge", 1<<62),
	}})
	wantCode(t, err, codes.Internal, `volume "huge"`, "create empty disk", "qemu-img", "too large")
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("work dir left behind with %v", listDir(t, work))
	}
}

func TestRealHostDisk(t *testing.T) {
	d := newReal(t)
	hostDir := t.TempDir()
	existing := filepath.Join(hostDir, "existing.img")
	writeRawDisk(t, existing, 8<<20)
	existingQcow2 := filepath.Join(hostDir, "existing.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", existingQcow2, "2G")
	created := filepath.Join(hostDir, "created.img")
	before := stateOf(t, existing)

	work := t.TempDir()
	disks := prepare(t, d, "v", work,
		hostDiskVol("a", existing, "Disk", 0),
		hostDiskVol("b", existingQcow2, "DiskOrCreate", 1<<30),
		hostDiskVol("c", created, "DiskOrCreate", 3<<30))
	wantDisks := []*storagev1.PreparedDisk{
		{VolumeName: "a", Path: existing, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: 8 << 20},
		{VolumeName: "b", Path: existingQcow2, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, SizeBytes: 2 << 30},
		{VolumeName: "c", Path: created, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: 3 << 30},
	}
	for i, w := range wantDisks {
		if !proto.Equal(disks[i], w) {
			t.Errorf("disk %d = %v, want %v", i, disks[i], w)
		}
	}
	fi, err := os.Stat(created)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 3<<30 || blocks(fi) != 0 {
		t.Errorf("created hostDisk: size %d, %d blocks; want a sparse 3 GiB file", fi.Size(), blocks(fi))
	}
	// The guest writes to a host disk in place.
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x33 0 64k", created)
	again := prepare(t, d, "v", work,
		hostDiskVol("a", existing, "Disk", 0),
		hostDiskVol("b", existingQcow2, "DiskOrCreate", 1<<30),
		hostDiskVol("c", created, "DiskOrCreate", 3<<30))
	for i := range again {
		if !proto.Equal(again[i], disks[i]) {
			t.Errorf("second Prepare: disk %d = %v, want %v", i, again[i], disks[i])
		}
	}
	release(t, d, "v", work)
	release(t, d, "v", work)
	// A hostDisk is persistent: the data the guest wrote survives Release, and the next VMI
	// that names it uses it in place.
	if got := readAt(t, created, 0, 4); !bytes.Equal(got, []byte{0x33, 0x33, 0x33, 0x33}) {
		t.Errorf("hostDisk created by Prepare lost its data on Release: first bytes %x", got)
	}
	next := prepare(t, d, "w", t.TempDir(), hostDiskVol("c", created, "DiskOrCreate", 3<<30))
	if next[0].GetPath() != created || next[0].GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW {
		t.Errorf("next VMI's disk = %v, want %s in place", next[0], created)
	}
	if stateOf(t, existing) != before || !exists(existingQcow2) {
		t.Error("hostDisks that existed before Prepare were changed or removed")
	}

	for _, tt := range []struct {
		vol  *storagev1.Volume
		want string
	}{
		{hostDiskVol("h", filepath.Join(hostDir, "missing.img"), "Disk", 0), "does not exist (type Disk needs an existing disk)"},
		{hostDiskVol("h", filepath.Join(hostDir, "new.img"), "DiskOrCreate", 0), "hostDisk.capacityBytes: required"},
		{hostDiskVol("h", filepath.Join(hostDir, "nodir", "new.img"), "DiskOrCreate", 1<<20), "directory " + filepath.Join(hostDir, "nodir") + " does not exist"},
		{hostDiskVol("h", existing, "Raw", 0), `hostDisk.type "Raw" is not supported`},
		{hostDiskVol("h", hostDir, "Disk", 0), "is not a regular file or block device"},
	} {
		_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{tt.vol}})
		wantCode(t, err, codes.InvalidArgument, `volume "h"`, tt.want)
	}
}

func TestRealEphemeral(t *testing.T) {
	d := newReal(t)
	pvcDir := t.TempDir()
	backing := filepath.Join(pvcDir, "disk.img")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", backing, "16M")
	before := stateOf(t, backing)
	work := t.TempDir()
	// The backing path may name the image, or the file system claim holding disk.img.
	disks := prepare(t, d, "v", work, ephemeralVol("eph", backing), ephemeralVol("eph-dir", pvcDir))
	for _, disk := range disks {
		info := imgInfo(t, disk.GetPath())
		if info.BackingFilename != backing || info.BackingFormat != "qcow2" || disk.GetSizeBytes() != 16<<20 || disk.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_QCOW2 {
			t.Errorf("%s: disk %v, info %+v", disk.GetVolumeName(), disk, info)
		}
		writeGuestData(t, disk.GetPath())
	}
	if stateOf(t, backing) != before {
		t.Error("the backing image changed")
	}
	release(t, d, "v", work)
	if stateOf(t, backing) != before {
		t.Error("the backing image changed on Release")
	}
}

func TestRealPersistentVolumeClaim(t *testing.T) {
	d := newReal(t)
	fsClaim := t.TempDir()
	writeRawDisk(t, filepath.Join(fsClaim, "disk.img"), 2<<20)
	blockLike := filepath.Join(t.TempDir(), "claim.raw")
	if err := os.WriteFile(blockLike, make([]byte, 1<<20), 0o644); err != nil { // blank: fine in place
		t.Fatal(err)
	}
	work := t.TempDir()
	disks := prepare(t, d, "v", work, pvcVol("data", fsClaim, false), pvcVol("ro", blockLike, true))
	want := []*storagev1.PreparedDisk{
		{VolumeName: "data", Path: filepath.Join(fsClaim, "disk.img"), Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: 2 << 20},
		{VolumeName: "ro", Path: blockLike, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true, SizeBytes: 1 << 20},
	}
	for i := range want {
		if !proto.Equal(disks[i], want[i]) {
			t.Errorf("disk %d = %v, want %v", i, disks[i], want[i])
		}
	}
	release(t, d, "v", work)
	if !exists(want[0].Path) || !exists(want[1].Path) {
		t.Error("Release removed a claim's image")
	}
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{pvcVol("empty", t.TempDir(), false)}})
	wantCode(t, err, codes.InvalidArgument, `volume "empty"`, "is a directory without disk.img")
}

// Every volume type in one VMI; Prepare twice returns the same disks without making anything
// again; an overlay is made again when its base changes; Release twice; only the driver's
// files go.
func TestRealAllTypesIdempotentAndRelease(t *testing.T) {
	d := newReal(t)
	node := t.TempDir()
	base := filepath.Join(node, "base.img")
	writeRawDisk(t, base, 4<<20)
	preexisting := filepath.Join(node, "host.img")
	writeRawDisk(t, preexisting, 1<<20)
	pvc := filepath.Join(node, "pvc.img")
	writeRawDisk(t, pvc, 1<<20)
	layout := filepath.Join(node, "oci")
	diskBytes, _ := os.ReadFile(base)
	writeOCILayout(t, layout, "gzip", []tarEntry{{name: "disk/disk.img", data: diskBytes}})

	work := filepath.Join(node, "vmi")
	if err := os.Mkdir(work, 0o750); err != nil {
		t.Fatal(err)
	}
	stranger := filepath.Join(work, "launcher.sock")
	if err := os.WriteFile(stranger, []byte("not ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	vols := []*storagev1.Volume{
		containerDiskVol("root", base),
		containerDiskVol("oci", layout),
		emptyDiskVol("scratch", 1<<30),
		hostDiskVol("host", preexisting, "Disk", 0),
		hostDiskVol("newhost", filepath.Join(node, "new.img"), "DiskOrCreate", 1<<20),
		ephemeralVol("eph", base),
		pvcVol("pvc", pvc, true),
		noCloudVol("nocloud", &storagev1.CloudInit{UserData: []byte("#cloud-config\n")}),
		configDriveVol("configdrive", &storagev1.CloudInit{UserData: []byte("#cloud-config\n")}),
	}
	first := prepare(t, d, "vmi", work, vols...)
	if len(first) != len(vols) {
		t.Fatalf("%d disks for %d volumes", len(first), len(vols))
	}
	for i, disk := range first {
		if disk.GetVolumeName() != vols[i].GetName() || disk.GetSizeBytes() == 0 {
			t.Errorf("disk %d = %v", i, disk)
		}
	}
	wantWork := []string{"configdrive.iso", "eph.qcow2", "launcher.sock", stateFile, "nocloud.iso", "oci.base", "oci.qcow2", "root.qcow2", "scratch.qcow2"}
	if got := listDir(t, work); !slices.Equal(got, wantWork) {
		t.Errorf("work dir = %v, want %v", got, wantWork)
	}
	inodes := map[string]uint64{}
	for _, n := range wantWork {
		inodes[n] = inode(t, filepath.Join(work, n))
	}

	second := prepare(t, d, "vmi", work, vols...)
	for i := range first {
		if !proto.Equal(first[i], second[i]) {
			t.Errorf("second Prepare: disk %d = %v, want %v", i, second[i], first[i])
		}
	}
	for _, n := range wantWork {
		if n != stateFile && inode(t, filepath.Join(work, n)) != inodes[n] {
			t.Errorf("second Prepare wrote %s again", n)
		}
	}

	// The base changes: the overlays over it are made again, the others are not.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(base, later, later); err != nil {
		t.Fatal(err)
	}
	prepare(t, d, "vmi", work, vols...)
	for _, n := range []string{"root.qcow2", "eph.qcow2"} {
		if inode(t, filepath.Join(work, n)) == inodes[n] {
			t.Errorf("base changed but %s was not made again", n)
		}
	}
	for _, n := range []string{"oci.qcow2", "scratch.qcow2", "nocloud.iso"} {
		if inode(t, filepath.Join(work, n)) != inodes[n] {
			t.Errorf("%s was made again though its inputs did not change", n)
		}
	}

	release(t, d, "vmi", work)
	release(t, d, "vmi", work)
	if got := listDir(t, work); !slices.Equal(got, []string{"launcher.sock"}) {
		t.Errorf("work dir after Release = %v, want only the stranger file", got)
	}
	// Bases, PVCs and hostDisks (even one Prepare created) are not the work directory's.
	for _, p := range []string{base, preexisting, pvc, filepath.Join(layout, "index.json"), filepath.Join(node, "new.img")} {
		if !exists(p) {
			t.Errorf("Release removed %s", p)
		}
	}
}

// A failure part way removes what the call made, and nothing a previous call made.
func TestRealFailureMidPrepare(t *testing.T) {
	d := newReal(t)
	node := t.TempDir()
	base := filepath.Join(node, "base.img")
	writeRawDisk(t, base, 1<<20)
	noDisk := filepath.Join(node, "oci")
	writeOCILayout(t, noDisk, "gzip", []tarEntry{{name: "etc/hostname", data: []byte("x")}})
	hostNew := filepath.Join(node, "host-new.img")

	work := filepath.Join(node, "vmi")
	_, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{
		containerDiskVol("first", base),
		hostDiskVol("created", hostNew, "DiskOrCreate", 1<<20),
		noCloudVol("ci", &storagev1.CloudInit{UserData: []byte("#cloud-config\n")}),
		containerDiskVol("bad", noDisk), // fails while extracting, after the others were made
	}})
	wantCode(t, err, codes.InvalidArgument, `volume "bad"`, "has no file under /disk/")
	if exists(work) || exists(hostNew) {
		t.Errorf("left behind: work dir %v, created hostDisk %v", listDir(t, work), exists(hostNew))
	}

	// With a previous Prepare on record, its files stay and the record is as it was.
	prepare(t, d, "v", work, containerDiskVol("first", base))
	recBefore, _ := os.ReadFile(filepath.Join(work, stateFile))
	_, err = d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{
		containerDiskVol("first", base),
		emptyDiskVol("second", 1<<20),
		containerDiskVol("bad", noDisk),
	}})
	wantCode(t, err, codes.InvalidArgument, `volume "bad"`)
	if got := listDir(t, work); !slices.Equal(got, []string{"first.qcow2", stateFile}) {
		t.Errorf("work dir = %v", got)
	}
	if recAfter, _ := os.ReadFile(filepath.Join(work, stateFile)); string(recAfter) != string(recBefore) {
		t.Errorf("record changed:\n%s\n→\n%s", recBefore, recAfter)
	}
	release(t, d, "v", work)
	if exists(work) {
		t.Errorf("work dir left: %v", listDir(t, work))
	}
}

// Different VMIs prepare and release in parallel, over one shared base.
func TestRealConcurrentVMIs(t *testing.T) {
	d := newReal(t)
	node := t.TempDir()
	base := filepath.Join(node, "base.img")
	writeRawDisk(t, base, 4<<20)
	before := stateOf(t, base)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			vmi := fmt.Sprintf("vmi-%d", i)
			work := filepath.Join(node, vmi)
			vols := []*storagev1.Volume{
				containerDiskVol("root", base),
				emptyDiskVol("scratch", 1<<30),
				noCloudVol("ci", &storagev1.CloudInit{UserData: []byte("#cloud-config\n"), Hostname: vmi}),
			}
			for range 2 {
				resp, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: vmi, WorkDir: work, Volumes: vols})
				if err != nil {
					errs <- fmt.Errorf("%s: prepare: %w", vmi, err)
					return
				}
				if len(resp.GetDisks()) != 3 {
					errs <- fmt.Errorf("%s: %d disks", vmi, len(resp.GetDisks()))
					return
				}
			}
			for range 2 {
				if err := d.Release(context.Background(), &storagev1.ReleaseRequest{VmiId: vmi, WorkDir: work}); err != nil {
					errs <- fmt.Errorf("%s: release: %w", vmi, err)
					return
				}
			}
			if exists(work) {
				errs <- fmt.Errorf("%s: work dir left", vmi)
			}
		})
	}
	// Meanwhile, the same VMI's work directory from two callers at once.
	work := filepath.Join(node, "shared")
	for range 4 {
		wg.Go(func() {
			if _, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: "same", WorkDir: work, Volumes: []*storagev1.Volume{containerDiskVol("root", base)}}); err != nil {
				errs <- fmt.Errorf("same VMI: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := listDir(t, work); !slices.Equal(got, []string{stateFile, "root.qcow2"}) {
		t.Errorf("shared work dir = %v", got)
	}
	if stateOf(t, base) != before {
		t.Error("base changed")
	}
}

// The driver across the real plugin boundary (gRPC in process): codes and messages survive.
func TestRealThroughGRPC(t *testing.T) {
	d := newReal(t)
	client, stop, err := driver.InProcess(basev1.Kind_KIND_STORAGE, d)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	st := client.(*driver.StorageClient)
	ctx := context.Background()

	caps, err := st.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(caps.GetVolumeTypes(), VolumeTypes) || len(VolumeTypes) != 7 || len(caps.GetFeatures()) != 0 {
		t.Errorf("capabilities = %v", caps)
	}
	info, err := st.Info(ctx)
	if err != nil || info.GetName() != "local" || info.GetKind() != basev1.Kind_KIND_STORAGE {
		t.Errorf("info = %v, %v", info, err)
	}

	text := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(text, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	_, err = st.Prepare(ctx, &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{containerDiskVol("rootdisk", text)}})
	wantCode(t, err, codes.InvalidArgument, fmt.Sprintf(`volume "rootdisk": %s is not a disk image: no partition table, filesystem or qcow2 header`, text))

	base := filepath.Join(t.TempDir(), "base.img")
	writeRawDisk(t, base, 1<<20)
	resp, err := st.Prepare(ctx, &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{containerDiskVol("rootdisk", base)}})
	if err != nil || len(resp.GetDisks()) != 1 {
		t.Fatalf("prepare: %v, %v", resp, err)
	}
	if err := st.Release(ctx, &storagev1.ReleaseRequest{VmiId: "v", WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, &storagev1.ReleaseRequest{VmiId: "v", WorkDir: work}); err != nil {
		t.Fatal(err)
	}
}

func TestRealFingerprint(t *testing.T) {
	d := newReal(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *basev1.FingerprintResponse, 4)
	done := make(chan error, 1)
	go func() { done <- d.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error { got <- r; return nil }) }()

	fp := <-got
	v := fp.GetAttributes()["qemu-img"]
	if fp.GetHealth() != basev1.Health_HEALTH_HEALTHY || !regexp.MustCompile(`^\d+\.\d+$`).MatchString(v) {
		t.Errorf("fingerprint = %v, want HEALTHY with qemu-img=<major.minor>", fp)
	}

	// Configured with a qemu-img that does not run: UNHEALTHY, said at once.
	if err := d.Configure(ctx, &basev1.ConfigureRequest{Config: []byte(`{"qemuImg": "/nonexistent/qemu-img"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case fp = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no fingerprint after Configure")
	}
	if fp.GetHealth() != basev1.Health_HEALTH_UNHEALTHY || !strings.Contains(fp.GetHealthDescription(), "/nonexistent/qemu-img") || len(fp.GetAttributes()) != 0 {
		t.Errorf("fingerprint = %v, want UNHEALTHY naming the binary", fp)
	}
	// Prepare says why it cannot make a qcow2 image.
	_, err := d.Prepare(ctx, &storagev1.PrepareRequest{VmiId: "v", WorkDir: t.TempDir(), Volumes: []*storagev1.Volume{emptyDiskVol("e", 1<<20)}})
	wantCode(t, err, codes.FailedPrecondition, `volume "e"`, "/nonexistent/qemu-img")

	if err := d.Configure(ctx, &basev1.ConfigureRequest{Config: []byte(`{"qemuImg": "` + requireTool(t, "qemu-img") + `"}`)}); err != nil {
		t.Fatal(err)
	}
	if fp = <-got; fp.GetHealth() != basev1.Health_HEALTH_HEALTHY {
		t.Errorf("fingerprint = %v after configuring the real qemu-img", fp)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Fingerprint returned %v when ctx ended", err)
	}
}

func TestConfigure(t *testing.T) {
	d := New(nil)
	for _, c := range []string{"", "  ", `{}`, `{"qemuImg": "/usr/bin/qemu-img"}`, `{"qemuImg": "/usr/bin/qemu-img"}`} {
		if err := d.Configure(context.Background(), &basev1.ConfigureRequest{Config: []byte(c)}); err != nil {
			t.Errorf("Configure(%q): %v", c, err)
		}
	}
	for _, c := range []string{`{"qemu_img": "x"}`, `{"qemuImg": 3}`, `[`} {
		err := d.Configure(context.Background(), &basev1.ConfigureRequest{Config: []byte(c)})
		wantCode(t, err, codes.InvalidArgument, "config")
	}
}

// readAt reads n bytes of file p at offset off.
func readAt(t *testing.T, p string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}
