package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func extract(t *testing.T, layout, image string) (string, []byte, error) {
	t.Helper()
	img, err := openOCILayout(layout, image)
	if err != nil {
		return "", nil, err
	}
	dst := filepath.Join(t.TempDir(), "disk")
	name, err := img.extractDisk(context.Background(), dst)
	if err != nil {
		return "", nil, err
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	return name, b, nil
}

func TestOCILayers(t *testing.T) {
	a, b := []byte("disk a content"), []byte("disk b content")
	for _, tt := range []struct {
		name     string
		layers   [][]tarEntry
		wantName string
		wantData []byte
		wantErr  string
	}{
		{name: "one layer", layers: [][]tarEntry{{{name: "disk/", dir: true}, {name: "disk/a.img", data: a}}}, wantName: "a.img", wantData: a},
		{name: "dot slash names", layers: [][]tarEntry{{{name: "./disk/a.img", data: a}}}, wantName: "a.img", wantData: a},
		{name: "upper layer wins", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: "disk/b.img", data: b}}}, wantName: "b.img", wantData: b},
		{name: "upper layer without disk", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: "etc/motd", data: b}}}, wantName: "a.img", wantData: a},
		{name: "whiteout", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: "disk/.wh.a.img"}}}, wantErr: "has no file under /disk/"},
		{name: "opaque", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: "disk/.wh..wh..opq"}}}, wantErr: "has no file under /disk/"},
		{name: "disk dir whited out", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: ".wh.disk"}}}, wantErr: "has no file under /disk/"},
		{name: "whiteout of another file", layers: [][]tarEntry{{{name: "disk/a.img", data: a}}, {{name: "disk/.wh.b.img"}}}, wantName: "a.img", wantData: a},
		{name: "two disks", layers: [][]tarEntry{{{name: "disk/a.img", data: a}, {name: "disk/b.img", data: b}}}, wantErr: "more than one file under /disk/ (a.img, b.img)"},
		{name: "nested file ignored", layers: [][]tarEntry{{{name: "disk/sub/x", data: b}, {name: "disk/a.img", data: a}}}, wantName: "a.img", wantData: a},
		{name: "no disk", layers: [][]tarEntry{{{name: "etc/motd", data: a}}}, wantErr: "has no file under /disk/"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			layout := t.TempDir()
			writeOCILayout(t, layout, "gzip", tt.layers...)
			name, data, err := extract(t, layout, "")
			if tt.wantErr != "" {
				if err == nil || !isBadImage(err) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want a bad image error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if name != tt.wantName || string(data) != string(tt.wantData) {
				t.Errorf("got %s %q, want %s %q", name, data, tt.wantName, tt.wantData)
			}
		})
	}
}

func TestOCISparseExtraction(t *testing.T) {
	disk := make([]byte, 8<<20)
	copy(disk[510:], []byte{0x55, 0xaa})
	copy(disk[5<<20:], "data in the middle")
	layout := t.TempDir()
	writeOCILayout(t, layout, "", []tarEntry{{name: "disk/disk.img", data: disk}})
	img, err := openOCILayout(layout, "")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "disk")
	if _, err := img.extractDisk(context.Background(), dst); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != int64(len(disk)) || sha256File(t, dst) != hex.EncodeToString(sum(disk)) {
		t.Error("extracted disk differs")
	}
	if blocks(fi)*512 > 1<<20 {
		t.Errorf("an 8 MiB disk of mostly zeroes takes %d bytes", blocks(fi)*512)
	}
}

func sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func TestOCICorruptLayer(t *testing.T) {
	layout := t.TempDir()
	writeOCILayout(t, layout, "", []tarEntry{{name: "disk/a.img", data: []byte("content")}})
	// Change the layer's bytes behind its digest.
	blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
	for _, b := range blobs {
		data, _ := os.ReadFile(b)
		if i := strings.Index(string(data), "content"); i >= 0 {
			data[i] = 'C'
			_ = os.WriteFile(b, data, 0o644)
		}
	}
	if _, _, err := extract(t, layout, ""); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("got %v", err)
	}
}

func TestOCIBadDigest(t *testing.T) {
	layout := t.TempDir()
	writeOCILayout(t, layout, "", []tarEntry{{name: "disk/a.img", data: []byte("x")}})
	idx := `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:../../../../etc/passwd","size":1}]}`
	if err := os.WriteFile(filepath.Join(layout, "index.json"), []byte(idx), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openOCILayout(layout, ""); err == nil || !strings.Contains(err.Error(), "is not a sha256 digest") {
		t.Errorf("got %v", err)
	}
}

// An index naming several images: the one named like the containerDisk's image, then the one
// for this platform; nested indexes are followed.
func TestOCIManifestSelection(t *testing.T) {
	layout := t.TempDir()
	writeOCILayout(t, layout, "", []tarEntry{{name: "disk/a.img", data: []byte("x")}})
	var idx ociIndex
	raw, _ := os.ReadFile(filepath.Join(layout, "index.json"))
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	good := idx.Manifests[0]
	good.Annotations = nil
	put := func(v any) ociDescriptor {
		b, _ := json.Marshal(v)
		s := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(s[:])
		_ = os.WriteFile(filepath.Join(layout, "blobs", "sha256", hex.EncodeToString(s[:])), b, 0o644)
		return ociDescriptor{MediaType: mediaTypeOCIManifest, Digest: d, Size: int64(len(b))}
	}
	other := put(map[string]any{"schemaVersion": 2, "layers": []ociDescriptor{{Digest: "sha256:" + strings.Repeat("0", 64)}}})
	platform := func(d ociDescriptor, os, arch string) ociDescriptor {
		d.Platform = &struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		}{os, arch}
		return d
	}
	otherArch := "s390x"
	if runtime.GOARCH == otherArch {
		otherArch = "amd64"
	}
	inner := put(ociIndex{MediaType: mediaTypeOCIIndex, Manifests: []ociDescriptor{
		platform(other, "unknown", "unknown"),
		platform(other, "linux", otherArch),
		platform(good, "linux", runtime.GOARCH),
	}})
	inner.MediaType = mediaTypeOCIIndex
	named := func(d ociDescriptor, ref string) ociDescriptor {
		d.Annotations = map[string]string{annotationRefName: ref}
		return d
	}
	write := func(ms ...ociDescriptor) {
		b, _ := json.Marshal(ociIndex{MediaType: mediaTypeOCIIndex, Manifests: ms})
		_ = os.WriteFile(filepath.Join(layout, "index.json"), b, 0o644)
	}

	write(named(other, "v1"), named(inner, "v2"))
	img, err := openOCILayout(layout, "quay.io/containerdisks/fedora:v2")
	if err != nil || img.manifest != good.Digest {
		t.Errorf("by tag and platform: got %v, %v; want %s", img, err, good.Digest)
	}
	img, err = openOCILayout(layout, "quay.io/containerdisks/fedora:v1")
	if err != nil || img.manifest != other.Digest {
		t.Errorf("by tag: got %v, %v; want %s", img, err, other.Digest)
	}
	write(inner)
	img, err = openOCILayout(layout, "")
	if err != nil || img.manifest != good.Digest {
		t.Errorf("by platform: got %v, %v; want %s", img, err, good.Digest)
	}
	write()
	if _, err := openOCILayout(layout, ""); err == nil || !strings.Contains(err.Error(), "lists no image manifest") {
		t.Errorf("empty index: %v", err)
	}
}
