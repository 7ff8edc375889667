package storage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// requireTool needs a qemu-utils binary: these tests are what show the driver works with the
// real qemu-img (skipped under -short, a failure under CI=true when it is missing).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.Command(t, name, "qemu-utils")
}

// run runs a command and returns its standard output, failing the test when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}

// writeRawDisk writes a raw disk of size bytes with an MBR boot signature and some content.
func writeRawDisk(t *testing.T, p string, size int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0x55, 0xaa}, 510); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("base image content"), 4096); err != nil {
		t.Fatal(err)
	}
}

// qcow2Bytes is a qcow2 header (and nothing else) for tests that do not run qemu-img.
func qcow2Bytes(version uint32, size uint64, backing, dataFile bool) []byte {
	b := make([]byte, 512)
	copy(b, qcow2Magic)
	be := binary.BigEndian
	be.PutUint32(b[4:], version)
	if backing {
		be.PutUint64(b[8:], 400)
		be.PutUint32(b[16:], 9)
		copy(b[400:], "/etc/shadow")
	}
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], size)
	if version == 3 {
		if dataFile {
			be.PutUint64(b[72:], 1<<2)
		}
		be.PutUint32(b[100:], 104)
	}
	return b
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name string
	data []byte
	dir  bool
}

// writeOCILayout writes an OCI image layout at dir with one image whose layers (bottom first)
// hold the entries given, compressed with "gzip", "zstd" or "" (none).
func writeOCILayout(t *testing.T, dir string, compression string, layers ...[]tarEntry) {
	t.Helper()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	putBlob := func(b []byte) (string, int64) {
		s := sha256.Sum256(b)
		h := hex.EncodeToString(s[:])
		if err := os.WriteFile(filepath.Join(blobs, h), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + h, int64(len(b))
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	var layerDescs []desc
	for _, entries := range layers {
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		for _, e := range entries {
			hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
			if e.dir {
				hdr = &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeDir}
			}
			if err := tw.WriteHeader(hdr); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		blob, mt := tb.Bytes(), "application/vnd.oci.image.layer.v1.tar"
		switch compression {
		case "gzip":
			var zb bytes.Buffer
			zw := gzip.NewWriter(&zb)
			_, _ = zw.Write(blob)
			_ = zw.Close()
			blob, mt = zb.Bytes(), mt+"+gzip"
		case "zstd":
			zw, _ := zstd.NewWriter(nil)
			blob, mt = zw.EncodeAll(blob, nil), mt+"+zstd"
		}
		d, n := putBlob(blob)
		layerDescs = append(layerDescs, desc{MediaType: mt, Digest: d, Size: n})
	}
	cfgDigest, cfgSize := putBlob([]byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`))
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeOCIManifest,
		"config":        desc{MediaType: "application/vnd.oci.image.config.v1+json", Digest: cfgDigest, Size: cfgSize},
		"layers":        layerDescs,
	})
	md, ms := putBlob(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeOCIIndex,
		"manifests":     []desc{{MediaType: mediaTypeOCIManifest, Digest: md, Size: ms, Annotations: map[string]string{annotationRefName: "latest"}}},
	})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeTool is an ImageTool that writes qcow2 headers instead of running qemu-img, and can be
// told to fail.
type fakeTool struct {
	mu      sync.Mutex
	creates []string
	// failCreate, when set, is asked before each Create.
	failCreate func(path string, opts CreateOptions) error
	version    string
	versionErr error
}

func (f *fakeTool) Version(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.versionErr != nil {
		return "", f.versionErr
	}
	if f.version == "" {
		return "7.2.22", nil
	}
	return f.version, nil
}

func (f *fakeTool) Create(_ context.Context, p string, opts CreateOptions) error {
	f.mu.Lock()
	f.creates = append(f.creates, p)
	fail := f.failCreate
	f.mu.Unlock()
	if fail != nil {
		if err := fail(p, opts); err != nil {
			return err
		}
	}
	size := opts.Size
	if opts.BackingFile != "" {
		im, err := detectImage(opts.BackingFile, opts.BackingFile)
		if err != nil {
			return err
		}
		size = im.virtualSize()
	}
	return os.WriteFile(p, qcow2Bytes(3, uint64(size), opts.BackingFile != "", false), 0o644)
}

func (f *fakeTool) Info(_ context.Context, p string, format Format) (*ImageInfo, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	h, err := parseQcow2Header(b)
	if err != nil {
		return nil, err
	}
	info := &ImageInfo{Format: format, VirtualSize: int64(h.size)}
	if h.hasBacking {
		info.BackingFile = "backing"
	}
	return info, nil
}

func (f *fakeTool) createCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.creates)
}

// newFake returns the driver with a fake image tool.
func newFake(tool *fakeTool) *Local {
	return New(nil, WithImageTool(func(string) ImageTool { return tool }))
}

// wantCode fails the test unless err is a status error with the code and, if given, a message
// holding every part.
func wantCode(t *testing.T, err error, code codes.Code, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("got %s (%v), want %s", st.Code(), err, code)
	}
	for _, p := range parts {
		if !strings.Contains(st.Message(), p) {
			t.Errorf("error %q does not say %q", st.Message(), p)
		}
	}
}

// listDir lists a directory's entries, sorted.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func prepare(t *testing.T, d *Local, vmi, workDir string, vols ...*storagev1.Volume) []*storagev1.PreparedDisk {
	t.Helper()
	resp, err := d.Prepare(context.Background(), &storagev1.PrepareRequest{VmiId: vmi, WorkDir: workDir, Volumes: vols})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	return resp.GetDisks()
}

func release(t *testing.T, d *Local, vmi, workDir string) {
	t.Helper()
	if err := d.Release(context.Background(), &storagev1.ReleaseRequest{VmiId: vmi, WorkDir: workDir}); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// Volume constructors.
func containerDiskVol(name, p string) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: "example.org/disk:latest", Path: p}}}
}

func emptyDiskVol(name string, capacity uint64) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: capacity}}}
}

func hostDiskVol(name, p, typ string, capacity uint64) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_HostDisk{HostDisk: &storagev1.HostDisk{Path: p, Type: typ, CapacityBytes: capacity}}}
}

func ephemeralVol(name, p string) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_Ephemeral{Ephemeral: &storagev1.Ephemeral{BackingPath: p}}}
}

func pvcVol(name, p string, ro bool) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_PersistentVolumeClaim{PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{ClaimName: name, Path: p, ReadOnly: ro}}}
}

func noCloudVol(name string, ci *storagev1.CloudInit) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: ci}}
}

func configDriveVol(name string, ci *storagev1.CloudInit) *storagev1.Volume {
	return &storagev1.Volume{Name: name, Source: &storagev1.Volume_CloudInitConfigDrive{CloudInitConfigDrive: ci}}
}

// inode is a file's inode number: a file written again through a rename has another.
func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// blocks is how many 512-byte blocks a file takes on disk.
func blocks(fi os.FileInfo) int64 { return fi.Sys().(*syscall.Stat_t).Blocks }
