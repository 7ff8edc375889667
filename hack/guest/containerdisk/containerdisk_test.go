package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/drivers/storage"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// qemuImg runs qemu-img, failing the test when it fails.
func qemuImg(t *testing.T, args ...string) []byte {
	t.Helper()
	p := testenv.Command(t, "qemu-img", "qemu-utils")
	out, err := exec.Command(p, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// smallDisk makes a 4 MiB qcow2 image with a few bytes written into it.
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	data := make([]byte, 4<<20)
	copy(data[510:], []byte{0x55, 0xaa})
	copy(data[1<<20:], "kubevisor containerdisk test")
	if err := os.WriteFile(raw, data, 0o600); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.qcow2")
	qemuImg(t, "convert", "-f", "raw", "-O", "qcow2", raw, disk)
	return disk
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// indexManifest reads the index.json of an OCI image layout.
func indexManifest(t *testing.T, dir string) *v1.IndexManifest {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return im
}

// layoutImage is the first image of an OCI image layout.
func layoutImage(t *testing.T, dir string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Image(indexManifest(t, dir).Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func write(t *testing.T, disk string) Options {
	t.Helper()
	out := t.TempDir()
	o := Options{
		Disk: disk, Ref: DefaultRef, Created: time.Unix(1700000000, 0),
		Layout: filepath.Join(out, "containerdisk"), Tarball: filepath.Join(out, "containerdisk.tar"),
	}
	if _, err := Write(o); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return o
}

// TestLocalStorageDriverPreparesTheLayout: the local storage driver takes the layout as a
// containerDisk and makes a qcow2 overlay whose backing file is the disk extracted from it.
func TestLocalStorageDriverPreparesTheLayout(t *testing.T) {
	disk := smallDisk(t)
	o := write(t, disk)

	ctx := context.Background()
	d := storage.New(nil)
	if err := d.Configure(ctx, &basev1.ConfigureRequest{}); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	vol := &storagev1.Volume{Name: "containerdisk", Source: &storagev1.Volume_ContainerDisk{
		ContainerDisk: &storagev1.ContainerDisk{Image: DefaultRef, Path: o.Layout},
	}}
	resp, err := d.Prepare(ctx, &storagev1.PrepareRequest{VmiId: "vmi-1", WorkDir: work, Volumes: []*storagev1.Volume{vol}})
	if err != nil {
		t.Fatalf("Prepare of a containerDisk of the layout: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Release(ctx, &storagev1.ReleaseRequest{VmiId: "vmi-1", WorkDir: work}); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
	if len(resp.GetDisks()) != 1 {
		t.Fatalf("Prepare returned %d disks, want 1", len(resp.GetDisks()))
	}
	got := resp.GetDisks()[0]
	if got.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_QCOW2 || got.GetReadOnly() || got.GetSizeBytes() != 4<<20 {
		t.Errorf("prepared disk %v, want a writable qcow2 of 4 MiB", got)
	}

	var info struct {
		Format        string `json:"format"`
		Backing       string `json:"full-backing-filename"`
		BackingFormat string `json:"backing-filename-format"`
	}
	if err := json.Unmarshal(qemuImg(t, "info", "-U", "--output=json", got.GetPath()), &info); err != nil {
		t.Fatal(err)
	}
	switch {
	case info.Format != "qcow2" || info.Backing == "":
		t.Fatalf("%s is %q with backing %q, want a qcow2 overlay", got.GetPath(), info.Format, info.Backing)
	case info.BackingFormat != "qcow2":
		t.Errorf("backing format %q, want qcow2 (the disk in the image)", info.BackingFormat)
	case filepath.Dir(info.Backing) != work:
		t.Errorf("backing file %s is not the disk extracted into the work directory %s", info.Backing, work)
	}
	if sha256File(t, info.Backing) != sha256File(t, disk) {
		t.Errorf("the backing file %s differs from the disk the image was made of", info.Backing)
	}
	if fi, err := os.Stat(info.Backing); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("the extracted base must not be writable: %v, %v", fi.Mode(), err)
	}
}

// TestLayout: the layout's index names the image and its platform; the image is an OCI image
// for linux/amd64 with one layer holding /disk/disk.qcow2 as KubeVirt's containerDisks do.
func TestLayout(t *testing.T) {
	disk := smallDisk(t)
	o := write(t, disk)

	im := indexManifest(t, o.Layout)
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Annotations[refAnnot] != DefaultRef {
		t.Errorf("ref.name %q, want %q", desc.Annotations[refAnnot], DefaultRef)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
		t.Errorf("platform %v, want linux/amd64", desc.Platform)
	}
	if desc.ArtifactType != "" {
		t.Errorf("an image's descriptor has artifactType %q, want none", desc.ArtifactType)
	}
	err := filepath.WalkDir(o.Layout, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if want := map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()]; err == nil && fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", p, fi.Mode().Perm(), want)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	img := layoutImage(t, o.Layout)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !cfg.Created.Equal(o.Created) {
		t.Errorf("config: %s/%s created %v, want linux/amd64 created %v", cfg.OS, cfg.Architecture, cfg.Created.Time, o.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type entry struct {
		typ      byte
		mode     int64
		uid, gid int
		size     int64
		sum      string
	}
	got := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		hs := sha256.New()
		if _, err := io.Copy(hs, tr); err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(o.Created) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, o.Created)
		}
		got[h.Name] = entry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, size: h.Size, sum: hex.EncodeToString(hs.Sum(nil))}
	}
	fi, _ := os.Stat(disk)
	want := map[string]entry{
		"disk/":           {typ: tar.TypeDir, mode: 0o555, uid: 107, gid: 107, sum: hex.EncodeToString(sha256.New().Sum(nil))},
		"disk/disk.qcow2": {typ: tar.TypeReg, mode: 0o444, uid: 107, gid: 107, size: fi.Size(), sum: sha256File(t, disk)},
	}
	if len(got) != len(want) {
		t.Errorf("layer holds %v, want %v", got, want)
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("layer entry %s: %+v, want %+v", n, got[n], w)
		}
	}
}

// TestTarball: the docker save tarball holds the same image, tagged.
func TestTarball(t *testing.T) {
	o := write(t, smallDisk(t))
	tag, err := name.NewTag(DefaultRef)
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := tarball.ImageFromPath(o.Tarball, &tag)
	if err != nil {
		t.Fatalf("the tarball has no image tagged %s: %v", DefaultRef, err)
	}
	fromLayout := layoutImage(t, o.Layout)
	a, _ := fromTar.ConfigName()
	b, _ := fromLayout.ConfigName()
	if a != b {
		t.Errorf("config %s in the tarball, %s in the layout", a, b)
	}
	la, _ := fromTar.Layers()
	lb, _ := fromLayout.Layers()
	da, _ := la[0].Digest()
	db, _ := lb[0].Digest()
	if da != db {
		t.Errorf("layer %s in the tarball, %s in the layout", da, db)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(o.Tarball) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != DefaultRef {
		t.Errorf("manifest.json %+v, want one image tagged %s", m, DefaultRef)
	}
}

// TestWriteIsReproducibleAndReplaces: the same disk and time give the same digest; a second
// Write replaces the layout (one manifest, not two) and refuses a directory that is not one.
func TestWriteIsReproducibleAndReplaces(t *testing.T) {
	disk := smallDisk(t)
	o := write(t, disk)
	first, err := Write(o)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Write(o)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("digests %s then %s of the same disk", first, second)
	}
	if idx := indexManifest(t, o.Layout); len(idx.Manifests) != 1 || idx.Manifests[0].Digest != first {
		t.Errorf("after writing again index.json lists %+v, want only %s", idx.Manifests, first)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(o.Layout), ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "precious"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o.Layout, o.Tarball = other, ""
	if _, err := Write(o); err == nil || !strings.Contains(err.Error(), "not replacing it") {
		t.Errorf("Write over a directory that is not a layout: %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Join(other, "precious")); err != nil {
		t.Errorf("the directory's file is gone: %v", err)
	}
}
