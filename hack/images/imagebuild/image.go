package imagebuild

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of every image.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// BaseTree is the scratch-like base every image starts from: root, nobody and the qemu user
// (107, as in KubeVirt's images) in /etc/passwd and /etc/group, /tmp, /root, /run, /var/run and
// an nsswitch.conf so that Go and glibc resolve names from files first.
func BaseTree() *Tree {
	t := NewTree()
	must := func(err error) {
		if err != nil {
			panic(err) // literal paths: cannot conflict
		}
	}
	must(t.AddBytes("/etc/passwd", []byte("root:x:0:0:root:/root:/sbin/nologin\nqemu:x:107:107:qemu:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"), 0o644))
	must(t.AddBytes("/etc/group", []byte("root:x:0:\nkvm:x:36:qemu\nqemu:x:107:\nnogroup:x:65534:\n"), 0o644))
	must(t.AddBytes("/etc/nsswitch.conf", []byte("hosts: files dns\n"), 0o644))
	must(t.AddDir("/tmp", 0o777|os.ModeSticky))
	must(t.AddDir("/root", 0o700))
	must(t.AddDir("/run", 0o755))
	must(t.AddSymlink("/var/run", "../run"))
	return t
}

// Config is what an image's config says besides its layers.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string // PATH=DefaultPath is added unless given
	WorkingDir string
	Labels     map[string]string
	Created    time.Time
}

// Layer turns a tree into an image layer (gzip at the fastest level: these are local imports).
func Layer(t *Tree) (v1.Layer, error) {
	data, err := t.TarBytes()
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
}

// Image builds a linux/amd64 image of the given trees, one layer each, bottom first.
func Image(cfg Config, trees ...*Tree) (v1.Image, error) {
	img := empty.Image
	for i, t := range trees {
		l, err := Layer(t)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{
			Created: v1.Time{Time: cfg.Created}, CreatedBy: "kubevisor hack/images",
		}}); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: cfg.Created}
	env := cfg.Env
	hasPath := false
	for _, e := range env {
		if len(e) > 5 && e[:5] == "PATH=" {
			hasPath = true
		}
	}
	if !hasPath {
		env = append([]string{"PATH=" + DefaultPath}, env...)
	}
	cf.Config = v1.Config{Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: env, WorkingDir: cfg.WorkingDir, Labels: cfg.Labels}
	return mutate.ConfigFile(img, cf)
}

// WriteTarball writes img as a `docker save` tarball tagged ref (replacing file), which
// `ctr -n k8s.io images import` reads; it returns the image digest.
func WriteTarball(img v1.Image, ref, file string) (v1.Hash, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return v1.Hash{}, err
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("write %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}
