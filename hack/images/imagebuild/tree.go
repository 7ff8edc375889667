// Package imagebuild assembles container image layers from files of this host and writes
// images as `docker save` tarballs for `ctr images import`, with no registry or Docker daemon:
// a Tree maps image paths to host files, directories and symlinks; adding a host path copies
// its symlink chain (so /lib -> usr/lib and libfoo.so.1 -> libfoo.so.1.2 stay as they are on
// the host), and adding an executable adds every library `ldd` lists for it.
package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type kind int

const (
	kindDir kind = iota
	kindFile
	kindSymlink
)

type entry struct {
	kind   kind
	mode   fs.FileMode // permission bits (plus sticky etc.)
	src    string      // host file for kindFile without data
	data   []byte      // literal content for kindFile
	target string      // kindSymlink
}

// Tree is the file tree of one image layer, keyed by absolute, cleaned image paths.
type Tree struct {
	entries map[string]*entry
	// ModTime dates every entry (default: the Unix epoch, so layers are reproducible).
	ModTime time.Time
}

// NewTree returns an empty tree.
func NewTree() *Tree { return &Tree{entries: map[string]*entry{}, ModTime: time.Unix(0, 0)} }

func clean(p string) string { return path.Clean("/" + p) }

// Has reports whether p is in the tree.
func (t *Tree) Has(p string) bool { _, ok := t.entries[clean(p)]; return ok }

// Paths returns every path in the tree, sorted.
func (t *Tree) Paths() []string {
	out := make([]string, 0, len(t.entries))
	for p := range t.entries {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Readlink returns the target of symlink p in the tree.
func (t *Tree) Readlink(p string) (string, bool) {
	e, ok := t.entries[clean(p)]
	if !ok || e.kind != kindSymlink {
		return "", false
	}
	return e.target, true
}

// Resolve follows symlinks inside the tree (as the container would see them) and returns the
// final path and whether it exists there.
func (t *Tree) Resolve(p string) (string, bool) {
	p = clean(p)
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		cur := "/"
		restarted := false
		for i, part := range parts {
			next := path.Join(cur, part)
			e, ok := t.entries[next]
			if !ok {
				return next, false
			}
			if e.kind == kindSymlink {
				target := e.target
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				p = path.Join(append([]string{target}, parts[i+1:]...)...)
				restarted = true
				break
			}
			cur = next
		}
		if !restarted {
			return p, true
		}
	}
	return p, false
}

func (t *Tree) put(p string, e *entry) error {
	p = clean(p)
	if p == "/" {
		return nil
	}
	if old, ok := t.entries[p]; ok {
		if old.kind == kindDir && e.kind == kindDir {
			return nil
		}
		if old.kind == e.kind && old.kind == kindSymlink && old.target == e.target {
			return nil
		}
		if old.kind == kindFile && e.kind == kindFile && old.src != "" && old.src == e.src {
			return nil
		}
		if old.kind != e.kind || old.kind == kindSymlink {
			return fmt.Errorf("%s: already in the layer as a different kind of file", p)
		}
	}
	if err := t.parents(p); err != nil {
		return err
	}
	t.entries[p] = e
	return nil
}

// parents adds the directories above p (0755) and refuses a path below a symlink of the tree.
func (t *Tree) parents(p string) error {
	dir := path.Dir(p)
	if dir == "/" {
		return nil
	}
	if e, ok := t.entries[dir]; ok {
		if e.kind != kindDir {
			return fmt.Errorf("%s: parent %s is not a directory in the layer", p, dir)
		}
		return nil
	}
	if err := t.parents(dir); err != nil {
		return err
	}
	t.entries[dir] = &entry{kind: kindDir, mode: 0o755}
	return nil
}

// AddDir adds directory p with mode.
func (t *Tree) AddDir(p string, mode fs.FileMode) error {
	return t.put(p, &entry{kind: kindDir, mode: mode})
}

// AddBytes adds a file with the given content.
func (t *Tree) AddBytes(p string, data []byte, mode fs.FileMode) error {
	return t.put(p, &entry{kind: kindFile, mode: mode, data: data})
}

// AddSymlink adds symlink p -> target.
func (t *Tree) AddSymlink(p, target string) error {
	return t.put(p, &entry{kind: kindSymlink, target: target})
}

// AddFileAs adds host file src at image path p (its permission bits kept; symlinks followed).
func (t *Tree) AddFileAs(p, src string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	return t.put(p, &entry{kind: kindFile, mode: fi.Mode() & (fs.ModePerm | fs.ModeSticky | fs.ModeSetuid | fs.ModeSetgid), src: src})
}

// AddHostPath adds host path p at the same path in the image, with every symlink met on the
// way (in p's directories or p itself) and the files they point to. A directory is added
// empty; AddHostTree adds its contents too.
func (t *Tree) AddHostPath(p string) error { return t.addHost(p, false, 0) }

// AddHostTree adds host directory p and everything below it, as AddHostPath does for each.
// Symlinks whose target is missing on the host are skipped.
func (t *Tree) AddHostTree(p string) error { return t.addHost(p, true, 0) }

func (t *Tree) addHost(p string, recursive bool, depth int) error {
	if depth > 40 {
		return fmt.Errorf("%s: too many levels of symbolic links", p)
	}
	p = filepath.Clean(p)
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s: not an absolute path", p)
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			abs := target
			if !filepath.IsAbs(abs) {
				abs = filepath.Join(cur, target)
			}
			rest := filepath.Join(append([]string{abs}, parts[i+1:]...)...)
			if err := t.addHost(rest, recursive, depth+1); err != nil {
				return err
			}
			// Only once the target is in: a link into the tree is never left dangling.
			return t.AddSymlink(next, target)
		}
		if i < len(parts)-1 {
			cur = next
			continue
		}
		switch {
		case fi.IsDir():
			if err := t.AddDir(next, fi.Mode()&(fs.ModePerm|fs.ModeSticky)); err != nil {
				return err
			}
			if recursive {
				return t.walk(next, depth)
			}
			return nil
		case fi.Mode().IsRegular():
			return t.AddFileAs(next, next)
		default:
			return fmt.Errorf("%s: neither file, directory nor symlink", next)
		}
	}
	return nil // p was "/"
}

func (t *Tree) walk(dir string, depth int) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range ents {
		p := filepath.Join(dir, de.Name())
		if de.Type()&fs.ModeSymlink != 0 {
			if _, err := os.Stat(p); err != nil {
				continue // dangling on the host (e.g. firmware of a package not installed)
			}
		}
		if de.Type()&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0 {
			continue
		}
		if err := t.addHost(p, true, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// AddExecutable adds host executable src at image path p (src's own path when p is "") and
// every shared library `ldd` lists for it, at their host paths (with their symlinks).
func (t *Tree) AddExecutable(p, src string) error {
	if !filepath.IsAbs(src) {
		found, err := exec.LookPath(src)
		if err != nil {
			return err
		}
		src = found
	}
	var err error
	if p == "" {
		err = t.AddHostPath(src)
	} else {
		err = t.AddFileAs(p, src)
	}
	if err != nil {
		return err
	}
	return t.AddLibraries(src)
}

// AddLibraries adds every shared library ldd lists for host file src (an executable or a
// shared object), with their symlinks.
func (t *Tree) AddLibraries(src string) error {
	libs, err := Libraries(src)
	if err != nil {
		return err
	}
	for _, l := range libs {
		if err := t.AddHostPath(l); err != nil {
			return fmt.Errorf("library of %s: %w", src, err)
		}
	}
	return nil
}

// Libraries returns the absolute paths of the shared libraries `ldd` lists for file (the
// dynamic loader included; the vDSO left out); none for a static executable. A library ldd
// cannot find is an error.
func Libraries(file string) ([]string, error) {
	out, err := exec.Command("ldd", file).CombinedOutput()
	text := string(out)
	if strings.Contains(text, "not a dynamic executable") || strings.Contains(text, "statically linked") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %v: %s", file, err, strings.TrimSpace(text))
	}
	return parseLdd(text, file)
}

func parseLdd(text, file string) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if name, where, ok := strings.Cut(line, "=>"); ok {
			where = strings.TrimSpace(where)
			if strings.HasPrefix(where, "not found") {
				return nil, fmt.Errorf("ldd %s: %s not found", file, strings.TrimSpace(name))
			}
			if f := strings.Fields(where); len(f) > 0 && filepath.IsAbs(f[0]) {
				libs = append(libs, f[0])
			}
			continue
		}
		if f := strings.Fields(line); len(f) > 0 && filepath.IsAbs(f[0]) {
			libs = append(libs, f[0]) // the dynamic loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
		}
	}
	return libs, sc.Err()
}

// Tar writes the tree as an uncompressed tar stream (sorted, root-owned, dated ModTime).
func (t *Tree) Tar(w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, p := range t.Paths() {
		e := t.entries[p]
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    int64(e.mode.Perm()),
			ModTime: t.ModTime,
			Format:  tar.FormatPAX,
		}
		if e.mode&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if e.mode&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if e.mode&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		switch e.kind {
		case kindDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case kindSymlink:
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.target, 0o777
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case kindFile:
			if err := writeFile(tw, hdr, e); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
	}
	return tw.Close()
}

func writeFile(tw *tar.Writer, hdr *tar.Header, e *entry) error {
	hdr.Typeflag = tar.TypeReg
	if e.src == "" {
		hdr.Size = int64(len(e.data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%s changed size while read", e.src)
	}
	return err
}

// TarBytes returns the tree's tar stream.
func (t *Tree) TarBytes() ([]byte, error) {
	var buf bytes.Buffer
	err := t.Tar(&buf)
	return buf.Bytes(), err
}
