package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// KubeVirt's containerDisk convention: the disk is the single file under /disk/, owned by the
// qemu user (107) and not writable.
const (
	diskDir   = "disk"
	qemuUID   = 107
	diskMode  = 0o444
	dirMode   = 0o555
	refAnnot  = "org.opencontainers.image.ref.name"
	createdBy = "kubevisor hack/guest/containerdisk"
)

// Options say what Write writes.
type Options struct {
	// Disk is the disk image the container disk carries, as /disk/<its base name>.
	Disk string
	// Ref names the image: the ref.name annotation of the layout's index, and the tag in the
	// tarball ("kubevisor/test-guest:latest").
	Ref string
	// Layout is the OCI image layout directory written; what was there is replaced (it must be
	// an OCI image layout, an empty directory, or absent).
	Layout string
	// Tarball, when set, is a `docker save` tarball of the same image written too (for `ctr
	// images import`, `docker load`); what was there is replaced.
	Tarball string
	// Created is the time of the image and of the files in its layer (the build's
	// SOURCE_DATE_EPOCH), so that the same disk gives the same image digest.
	Created time.Time
}

// Image builds the container disk image of o.Disk: one layer holding /disk/<name> (mode 0444,
// owner 107:107) under /disk/ (0555, 107:107), gzip-compressed; OCI media types; the config for
// linux/amd64.
func Image(o Options) (v1.Image, error) {
	fi, err := os.Stat(o.Disk)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("disk: %s is not a regular file", o.Disk)
	}
	created := o.Created.UTC().Truncate(time.Second)
	opener := func() (io.ReadCloser, error) { return diskTar(o.Disk, created) }
	layer, err := tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: createdBy, Comment: "containerDisk " + filepath.Base(o.Disk)},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Created = v1.Time{Time: created}
	return mutate.ConfigFile(img, cfg)
}

// diskTar streams the layer's tar: the /disk/ directory and the disk in it.
func diskTar(disk string, mtime time.Time) (io.ReadCloser, error) {
	f, err := os.Open(disk)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer f.Close()
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir, Name: diskDir + "/", Mode: dirMode,
			Uid: qemuUID, Gid: qemuUID, ModTime: mtime,
		})
		if err == nil {
			err = tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeReg, Name: diskDir + "/" + filepath.Base(disk), Mode: diskMode, Size: fi.Size(),
				Uid: qemuUID, Gid: qemuUID, ModTime: mtime,
			})
		}
		if err == nil {
			_, err = io.Copy(tw, f)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Write writes the image of o.Disk as the OCI image layout o.Layout and, when o.Tarball is
// set, as a `docker save` tarball. Both are written beside their destination and renamed into
// place, so that a failed run leaves the previous ones. It returns the image's manifest digest.
func Write(o Options) (v1.Hash, error) {
	ref, err := name.NewTag(o.Ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image name: %w", err)
	}
	img, err := Image(o)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest: %w", err)
	}
	if err := writeLayout(o.Layout, o.Ref, img); err != nil {
		return v1.Hash{}, err
	}
	if o.Tarball != "" {
		if err := writeTarball(o.Tarball, ref, img); err != nil {
			return v1.Hash{}, err
		}
	}
	return digest, nil
}

func writeLayout(dir, ref string, img v1.Image) error {
	if err := replaceable(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := p.WriteImage(img); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	desc, err := partial.Descriptor(img)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	// go-containerregistry fills in artifactType from the config's media type; an image's
	// descriptor has none (OCI image spec: artifactType is for artifacts).
	desc.ArtifactType = ""
	desc.Annotations = map[string]string{refAnnot: ref}
	desc.Platform = &v1.Platform{OS: "linux", Architecture: "amd64"}
	if err := p.AppendDescriptor(*desc); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := readable(tmp); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// readable makes the layout's directories 0755 and its files 0644: go-containerregistry writes
// index.json and oci-layout executable, and some blobs 0600.
func readable(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	})
}

// replaceable checks that dir may be replaced: absent, empty, or an OCI image layout.
func replaceable(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case len(entries) == 0:
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("%s is neither empty nor an OCI image layout: not replacing it", dir)
	}
	return nil
}

func writeTarball(path string, ref name.Tag, img v1.Image) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := tarball.Write(ref, img, f); err != nil {
		f.Close()
		return fmt.Errorf("tarball: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
