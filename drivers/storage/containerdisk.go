package storage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// containerDiskDir is where a containerDisk image keeps its disk (KubeVirt's convention): the
// single file under /disk/.
const containerDiskDir = "disk"

// containerSource is a containerDisk's path resolved: either a disk image file on the node
// (a file, or the single file under <dir>/disk/ of an unpacked image), or an OCI image layout
// whose disk must first be extracted.
type containerSource struct {
	file string
	oci  *ociImage
}

// resolveContainerDisk finds the base disk a containerDisk's path names, without reading more
// than directory entries and the OCI layout's JSON.
func resolveContainerDisk(p, image string) (*containerSource, error) {
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, badImage("%s does not exist", p)
		}
		return nil, fmt.Errorf("stat %s: %w", p, err)
	}
	if !fi.IsDir() {
		return &containerSource{file: p}, nil
	}
	if isFile(filepath.Join(p, "oci-layout")) && isFile(filepath.Join(p, "index.json")) {
		img, err := openOCILayout(p, image)
		if err != nil {
			return nil, err
		}
		return &containerSource{oci: img}, nil
	}
	diskDir := filepath.Join(p, containerDiskDir)
	entries, err := os.ReadDir(diskDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, badImage("%s is a directory with neither %s/ (an unpacked container image) nor oci-layout and index.json (an OCI image layout)", p, containerDiskDir)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", diskDir, err)
	}
	var files []string
	for _, e := range entries {
		// Stat, not e.Type(): a symlink to a disk counts as the disk.
		if efi, err := os.Stat(filepath.Join(diskDir, e.Name())); err == nil && !efi.IsDir() {
			files = append(files, e.Name())
		}
	}
	switch len(files) {
	case 0:
		return nil, badImage("%s holds no disk image file", diskDir)
	case 1:
		return &containerSource{file: filepath.Join(diskDir, files[0])}, nil
	default:
		return nil, badImage("%s holds %d files (%s); a container disk has exactly one", diskDir, len(files), strings.Join(files, ", "))
	}
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// OCI media types the layout reader follows.
const (
	mediaTypeOCIIndex      = "application/vnd.oci.image.index.v1+json"
	mediaTypeOCIManifest   = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeDockerList    = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaTypeDockerManifst = "application/vnd.docker.distribution.manifest.v2+json"
	annotationRefName      = "org.opencontainers.image.ref.name"
	// maxIndexDepth bounds how deep nested indexes are followed.
	maxIndexDepth = 4
	// maxJSONBlob bounds the index and manifest blobs read into memory.
	maxJSONBlob = 4 << 20
)

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

type ociIndex struct {
	MediaType string          `json:"mediaType"`
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Layers    []ociDescriptor `json:"layers"`
}

// ociImage is one image manifest of an OCI image layout.
type ociImage struct {
	layout string
	// manifest is the manifest's digest: it names the image's content, so a changed digest
	// means a changed disk.
	manifest string
	layers   []ociDescriptor
}

// openOCILayout reads the layout's index and picks the image manifest: the one whose ref.name
// annotation is image (or its tag) when several are named, then the one for this node's
// platform, then the first.
func openOCILayout(dir, image string) (*ociImage, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
	if err != nil {
		return nil, fmt.Errorf("read oci-layout: %w", err)
	}
	var layout struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(raw, &layout); err != nil || layout.Version == "" {
		return nil, badImage("%s/oci-layout is not an OCI image layout marker", dir)
	}
	raw, err = os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, fmt.Errorf("read index.json: %w", err)
	}
	var idx ociIndex
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, badImage("%s/index.json: %v", dir, err)
	}
	manifests, err := flattenIndex(dir, idx.Manifests, nil, 0)
	if err != nil {
		return nil, err
	}
	m, err := pickManifest(manifests, image)
	if err != nil {
		return nil, badImage("OCI layout %s: %v", dir, err)
	}
	raw, err = readBlob(dir, m)
	if err != nil {
		return nil, err
	}
	var man ociManifest
	if err := json.Unmarshal(raw, &man); err != nil {
		return nil, badImage("OCI layout %s: manifest %s: %v", dir, m.Digest, err)
	}
	if len(man.Layers) == 0 {
		return nil, badImage("OCI layout %s: manifest %s has no layers", dir, m.Digest)
	}
	return &ociImage{layout: dir, manifest: m.Digest, layers: man.Layers}, nil
}

// flattenIndex returns the image manifests an index lists, following nested indexes. The
// ref.name of an outer descriptor is passed down to the manifests it leads to.
func flattenIndex(dir string, descs []ociDescriptor, inherited map[string]string, depth int) ([]ociDescriptor, error) {
	if depth > maxIndexDepth {
		return nil, badImage("OCI layout %s: indexes nested deeper than %d", dir, maxIndexDepth)
	}
	var out []ociDescriptor
	for _, d := range descs {
		if d.Annotations[annotationRefName] == "" && inherited[annotationRefName] != "" {
			d.Annotations = map[string]string{annotationRefName: inherited[annotationRefName]}
		}
		switch d.MediaType {
		case mediaTypeOCIManifest, mediaTypeDockerManifst:
			out = append(out, d)
		case mediaTypeOCIIndex, mediaTypeDockerList:
			raw, err := readBlob(dir, d)
			if err != nil {
				return nil, err
			}
			var idx ociIndex
			if err := json.Unmarshal(raw, &idx); err != nil {
				return nil, badImage("OCI layout %s: index %s: %v", dir, d.Digest, err)
			}
			more, err := flattenIndex(dir, idx.Manifests, d.Annotations, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
	}
	return out, nil
}

func pickManifest(ms []ociDescriptor, image string) (ociDescriptor, error) {
	// Attestations and other artifacts are listed with the platform unknown/unknown.
	ms = filter(ms, func(d ociDescriptor) bool { return d.Platform == nil || d.Platform.OS != "unknown" })
	if image != "" {
		tag := ""
		if i := strings.LastIndexByte(image, ':'); i > strings.LastIndexByte(image, '/') {
			tag = image[i+1:]
		}
		named := filter(ms, func(d ociDescriptor) bool {
			ref := d.Annotations[annotationRefName]
			return ref != "" && (ref == image || ref == tag)
		})
		if len(named) > 0 {
			ms = named
		}
	}
	if len(ms) > 1 {
		here := filter(ms, func(d ociDescriptor) bool {
			return d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH
		})
		if len(here) > 0 {
			ms = here
		}
	}
	if len(ms) == 0 {
		return ociDescriptor{}, errors.New("index.json lists no image manifest")
	}
	return ms[0], nil
}

func filter[T any](s []T, keep func(T) bool) []T {
	var out []T
	for _, v := range s {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// blobPath is where a layout keeps the blob of d, after checking its digest's form so that a
// crafted digest cannot name a path outside the layout.
func blobPath(dir string, d ociDescriptor) (string, error) {
	alg, hexDigest, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" || len(hexDigest) != sha256.Size*2 || strings.Trim(hexDigest, "0123456789abcdef") != "" {
		return "", badImage("OCI layout %s: digest %q is not a sha256 digest", dir, d.Digest)
	}
	return filepath.Join(dir, "blobs", alg, hexDigest), nil
}

// readBlob reads a small JSON blob and checks its digest.
func readBlob(dir string, d ociDescriptor) ([]byte, error) {
	p, err := blobPath(dir, d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, badImage("OCI layout %s: blob %s is missing", dir, d.Digest)
		}
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxJSONBlob+1))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", d.Digest, err)
	}
	if len(raw) > maxJSONBlob {
		return nil, badImage("OCI layout %s: blob %s is larger than %d bytes", dir, d.Digest, maxJSONBlob)
	}
	if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != d.Digest {
		return nil, badImage("OCI layout %s: blob %s does not match its digest", dir, d.Digest)
	}
	return raw, nil
}

// extractDisk writes the image's disk (the single regular file under disk/ of the topmost
// layer that has one, honouring whiteouts of the layers above) to dst, sparse. It returns the
// disk's name in the image.
func (img *ociImage) extractDisk(ctx context.Context, dst string) (string, error) {
	// whiteouts are the disk/ names deleted by the layers scanned so far (the upper ones);
	// opaque is true once a layer hid everything below it in disk/.
	whiteouts := map[string]bool{}
	opaque := false
	for i := len(img.layers) - 1; i >= 0 && !opaque; i-- {
		name, found, err := img.scanLayer(ctx, img.layers[i], dst, whiteouts, &opaque)
		if err != nil {
			return "", err
		}
		if found {
			return name, nil
		}
	}
	return "", badImage("OCI layout %s: image %s has no file under /%s/", img.layout, img.manifest, containerDiskDir)
}

// scanLayer reads one layer. If it holds regular files directly under disk/ that upper layers
// did not delete, there must be exactly one: it is written to dst. Otherwise the layer's
// whiteouts under disk/ are added for the layers below.
func (img *ociImage) scanLayer(ctx context.Context, d ociDescriptor, dst string, whiteouts map[string]bool, opaque *bool) (string, bool, error) {
	p, err := blobPath(img.layout, d)
	if err != nil {
		return "", false, err
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, badImage("OCI layout %s: layer %s is missing", img.layout, d.Digest)
		}
		return "", false, err
	}
	defer f.Close()
	h := sha256.New()
	layer, closeLayer, err := decompress(io.TeeReader(f, h))
	if err != nil {
		return "", false, badImage("OCI layout %s: layer %s: %v", img.layout, d.Digest, err)
	}
	defer closeLayer()

	var found string
	var newWhiteouts []string
	layerOpaque := false
	tr := tar.NewReader(layer)
	for {
		if err := ctx.Err(); err != nil {
			return "", false, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", false, badImage("OCI layout %s: layer %s: %v", img.layout, d.Digest, err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		dir, base := path.Split(name)
		switch {
		case name == ".wh."+containerDiskDir:
			layerOpaque = true
		case dir != containerDiskDir+"/":
		case base == ".wh..wh..opq":
			layerOpaque = true
		case strings.HasPrefix(base, ".wh."):
			newWhiteouts = append(newWhiteouts, strings.TrimPrefix(base, ".wh."))
		case hdr.Typeflag != tar.TypeReg || whiteouts[base]:
		case found != "":
			return "", false, badImage("OCI layout %s: layer %s holds more than one file under /%s/ (%s, %s); a container disk has exactly one", img.layout, d.Digest, containerDiskDir, found, base)
		default:
			found = base
			if err := writeSparse(ctx, dst, tr, hdr.Size); err != nil {
				return "", false, fmt.Errorf("extract %s from layer %s: %w", name, d.Digest, err)
			}
		}
	}
	// Read what the tar reader left (padding, compression trailer) so the digest covers the blob.
	if _, err := io.Copy(io.Discard, layer); err != nil {
		return "", false, badImage("OCI layout %s: layer %s: %v", img.layout, d.Digest, err)
	}
	if err := checkDigest(h, f, d.Digest); err != nil {
		return "", false, badImage("OCI layout %s: layer %s: %v", img.layout, d.Digest, err)
	}
	if found != "" {
		return found, true, nil
	}
	for _, w := range newWhiteouts {
		whiteouts[w] = true
	}
	if layerOpaque {
		*opaque = true
	}
	return "", false, nil
}

// checkDigest finishes hashing f (the decompressor may not have read it to its end) and
// compares the sum with digest.
func checkDigest(h hash.Hash, f *os.File, digest string) error {
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("content does not match its digest (got %s)", got)
	}
	return nil
}

// decompress returns the tar stream of a layer, gzip- or zstd-compressed or not, told by its
// first bytes rather than by the media type, which tools get wrong.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { _ = zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// sparseChunk is the unit writeSparse leaves as a hole when it reads only zeroes.
const sparseChunk = 64 << 10

// writeSparse copies size bytes of r into a new file at dst, seeking over runs of zeroes so
// that an unused raw disk costs no space.
func writeSparse(ctx context.Context, dst string, r io.Reader, size int64) (err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	buf := make([]byte, sparseChunk)
	var off int64
	for off < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if n > 0 && !allZero(buf[:n]) {
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return err
			}
		}
		off += int64(n)
		if rerr != nil {
			if off < size {
				return fmt.Errorf("short file: %d of %d bytes: %w", off, size, rerr)
			}
			break
		}
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

var zeroChunk = make([]byte, sparseChunk)

func allZero(b []byte) bool { return bytes.Equal(b, zeroChunk[:len(b)]) }
