package imagebuild

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubevisor/kubevisor/internal/testenv"
)

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
	got, err := parseLdd(out, "x")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := parseLdd("\tlibmissing.so.3 => not found\n", "x"); err == nil {
		t.Error("a library ldd cannot find must be an error")
	}
}

// TestHostSymlinkChains: a host path reached through symlinked directories and a symlinked
// file keeps the links in the layer, and the links resolve to the file inside the layer.
func TestHostSymlinkChains(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "usr/lib/x"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "usr/lib/x/libfoo.so.1.2"), []byte("elf"), 0o644))
	must(t, os.Symlink("libfoo.so.1.2", filepath.Join(root, "usr/lib/x/libfoo.so.1")))
	must(t, os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(t, os.Symlink(filepath.Join(root, "usr/lib/x/gone"), filepath.Join(root, "usr/lib/x/dangling")))

	tr := NewTree()
	must(t, tr.AddHostPath(filepath.Join(root, "lib/x/libfoo.so.1")))
	if target, ok := tr.Readlink(filepath.Join(root, "lib")); !ok || target != "usr/lib" {
		t.Errorf("dir symlink: %q %v", target, ok)
	}
	if target, ok := tr.Readlink(filepath.Join(root, "usr/lib/x/libfoo.so.1")); !ok || target != "libfoo.so.1.2" {
		t.Errorf("file symlink: %q %v", target, ok)
	}
	final, ok := tr.Resolve(filepath.Join(root, "lib/x/libfoo.so.1"))
	if !ok || final != filepath.Join(root, "usr/lib/x/libfoo.so.1.2") {
		t.Errorf("resolve: %q %v", final, ok)
	}
	// A tree walk skips the dangling link instead of failing.
	tr2 := NewTree()
	must(t, tr2.AddHostTree(filepath.Join(root, "usr/lib")))
	if tr2.Has(filepath.Join(root, "usr/lib/x/dangling")) {
		t.Error("dangling symlink copied")
	}
	if !tr2.Has(filepath.Join(root, "usr/lib/x/libfoo.so.1.2")) {
		t.Error("tree walk missed a file")
	}
}

// layerEntries reads an image layer back: path -> header.
func layerEntries(t *testing.T, l v1.Layer) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out["/"+strings.TrimSuffix(h.Name, "/")] = h
	}
}

// resolveIn follows symlinks among the layer's entries.
func resolveIn(ents map[string]*tar.Header, p string) (*tar.Header, bool) {
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
		cur, restarted := "/", false
		for i, part := range parts {
			next := path.Join(cur, part)
			h, ok := ents[next]
			if !ok {
				return nil, false
			}
			if h.Typeflag == tar.TypeSymlink {
				target := h.Linkname
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				p, restarted = path.Join(append([]string{target}, parts[i+1:]...)...), true
				break
			}
			if i == len(parts)-1 {
				return h, true
			}
			cur = next
		}
		if !restarted {
			return nil, false
		}
	}
	return nil, false
}

// TestQEMULayer: the launcher's QEMU layer holds qemu-system-x86_64 and every library ldd
// lists for it (each resolving, through the layer's own symlinks, to a regular file), the TCG
// module and the firmware; as root, QEMU then starts a pc machine (loading SeaBIOS) inside a
// chroot of the layer alone, and so do swtpm (with the libraries it links: libtpms and its
// own in /usr/lib/x86_64-linux-gnu/swtpm) and qemu-storage-daemon.
func TestQEMULayer(t *testing.T) {
	qemu := testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	swtpm := testenv.Command(t, "swtpm", "swtpm")
	qsd := testenv.Command(t, "qemu-storage-daemon", "qemu-system-common")
	tr := BaseTree()
	if err := AddQEMU(tr, DefaultQEMUOptions()); err != nil {
		t.Fatal(err)
	}
	l, err := Layer(tr)
	if err != nil {
		t.Fatal(err)
	}
	ents := layerEntries(t, l)
	libs, err := Libraries(qemu)
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) < 5 {
		t.Fatalf("ldd lists only %q for %s", libs, qemu)
	}
	opts := DefaultQEMUOptions()
	mods, _ := filepath.Glob(filepath.Join(opts.ModuleDir, "accel-tcg-x86_64.so"))
	swtpmLibs, err := Libraries(swtpm)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{qemu, swtpm, qsd}, libs...)
	want = append(want, swtpmLibs...)
	want = append(want, mods...)
	want = append(want, "/usr/share/seabios/bios-256k.bin", "/usr/lib/ipxe/qemu/efi-virtio.rom", "/usr/share/qemu/kvmvapic.bin", "/usr/share/qemu/keymaps/en-us", "/usr/share/OVMF/OVMF_CODE.fd")
	for _, p := range want {
		h, ok := resolveIn(ents, p)
		if !ok || h.Typeflag != tar.TypeReg {
			t.Errorf("%s: not a file in the layer", p)
		}
	}
	if len(mods) == 0 {
		t.Logf("no TCG module in %s (QEMU built with TCG inside)", opts.ModuleDir)
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "not root: QEMU's run in a chroot of the layer needs root")
	}
	dir := t.TempDir()
	extract(t, l, dir)
	start := time.Now()
	cmd := exec.Command("chroot", dir, qemu, "-machine", "pc", "-accel", "tcg", "-display", "none", "-nodefaults", "-S", "-monitor", "stdio")
	cmd.Stdin = strings.NewReader("quit\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("QEMU in a chroot of the layer: %v\n%s", err, out)
	}
	t.Logf("QEMU (TCG) started and quit inside the layer alone in %v; layer has %d entries", time.Since(start), len(ents))
	if out, err := exec.Command("chroot", dir, swtpm, "socket", "--tpm2", "--print-capabilities").CombinedOutput(); err != nil || !strings.Contains(string(out), `"tpm-2.0"`) {
		t.Fatalf("swtpm in a chroot of the layer: %v\n%s", err, out)
	}
	if out, err := exec.Command("chroot", dir, qsd, "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), "qemu-storage-daemon") {
		t.Fatalf("qemu-storage-daemon in a chroot of the layer: %v\n%s", err, out)
	}
}

func extract(t *testing.T, l v1.Layer, dir string) {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		must(t, err)
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			must(t, os.MkdirAll(p, 0o755))
		case tar.TypeSymlink:
			must(t, os.Symlink(h.Linkname, p))
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			must(t, err)
			_, err = io.Copy(f, tr)
			must(t, err)
			must(t, f.Close())
		}
	}
}

func TestImageTarball(t *testing.T) {
	tr := BaseTree()
	must(t, tr.AddBytes("/usr/local/bin/hello", []byte("#!/bin/sh\necho hi\n"), 0o755))
	img, err := Image(Config{Entrypoint: []string{"/usr/local/bin/hello"}}, tr)
	must(t, err)
	file := filepath.Join(t.TempDir(), "hello.tar")
	d1, err := WriteTarball(img, "kubevisor/hello:dev", file)
	must(t, err)
	// Same input, same digest: the layer is dated and ordered deterministically.
	img2, err := Image(Config{Entrypoint: []string{"/usr/local/bin/hello"}}, tr)
	must(t, err)
	d2, err := img2.Digest()
	must(t, err)
	if d1 != d2 {
		t.Errorf("digests differ: %s %s", d1, d2)
	}
	cf, err := img.ConfigFile()
	must(t, err)
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.Env[0] != "PATH="+DefaultPath {
		t.Errorf("config: %+v", cf)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
