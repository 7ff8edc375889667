package libvirt

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubevisor/kubevisor/internal/testenv"
)

func TestAddUserKeepsGroupAndOrder(t *testing.T) {
	// A file of mode 0640 without an ACL: the mask is the group's and the new entry's.
	entries, changed := addUser([]aclEntry{
		{tag: aclUserObj, perm: 6, id: aclNoID},
		{tag: aclGroupObj, perm: 4, id: aclNoID},
		{tag: aclOther, perm: 0, id: aclNoID},
	}, 65534, permR|permW)
	want := []aclEntry{
		{tag: aclUserObj, perm: 6, id: aclNoID},
		{tag: aclUser, perm: 6, id: 65534},
		{tag: aclGroupObj, perm: 4, id: aclNoID},
		{tag: aclMask, perm: 6, id: aclNoID},
		{tag: aclOther, perm: 0, id: aclNoID},
	}
	if !changed || !reflect.DeepEqual(entries, want) {
		t.Fatalf("addUser = %v, %v; want %v, true", entries, changed, want)
	}
	// Again: nothing to do.
	if _, changed := addUser(entries, 65534, permR); changed {
		t.Error("addUser of a permission the entry has reported a change")
	}
	// Widening an existing entry widens the mask, and a second user sorts by id.
	entries, _ = addUser(entries, 1000, permX)
	entries, _ = addUser(entries, 65534, permX)
	if entries[1] != (aclEntry{tag: aclUser, perm: 1, id: 1000}) || entries[2] != (aclEntry{tag: aclUser, perm: 7, id: 65534}) || entries[4].perm != 7 {
		t.Errorf("entries = %v", entries)
	}
	if got, err := decodeACL(encodeACL(entries)); err != nil || !reflect.DeepEqual(got, entries) {
		t.Errorf("decode(encode) = %v, %v", got, err)
	}
}

// TestGrantAccess gives nobody a root file in root's 0700 directories: nobody reads that file,
// not its sibling, and the modes stay.
func TestGrantAccess(t *testing.T) {
	testenv.Root(t, "files are made as root and opened as nobody")
	u, err := lookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file, sibling := filepath.Join(dir, "disk.img"), filepath.Join(dir, "other.img")
	for _, p := range []string{file, sibling} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := accessAs(u, file, false); err == nil {
		t.Fatal("nobody opened a root 0600 file before any grant: the test proves nothing here")
	}
	if err := reachable(u, file, false); err != nil {
		t.Fatal(err)
	}
	if err := accessAs(u, file, true); err == nil {
		t.Error("nobody may write a file it was granted read access to")
	}
	if err := accessAs(u, sibling, false); err == nil {
		t.Error("nobody opens the sibling it was given nothing on")
	}
	for p, mode := range map[string]os.FileMode{file: 0o600, dir: 0o700} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		// The group bits show the mask: nothing for the file's group, which had nothing.
		if got := st.Mode().Perm() &^ 0o070; got != mode {
			t.Errorf("%s: mode %v, want %v (bar the mask)", p, st.Mode().Perm(), mode)
		}
	}
	if err := reachable(u, file, true); err != nil {
		t.Fatal(err)
	}
}

func TestQCOW2Backing(t *testing.T) {
	qemuImg := testenv.Command(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	over := filepath.Join(dir, "sub", "over.qcow2")
	if err := os.Mkdir(filepath.Dir(over), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"create", "-q", "-f", "qcow2", base, "1M"},
		{"create", "-q", "-f", "qcow2", "-b", "../base.qcow2", "-F", "qcow2", over},
	} {
		if out, err := exec.Command(qemuImg, args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v: %s", args, err, out)
		}
	}
	if got := qcow2Backing(over); got != base {
		t.Errorf("qcow2Backing(overlay) = %q, want %q", got, base)
	}
	if got := qcow2Backing(base); got != "" {
		t.Errorf("qcow2Backing(base) = %q, want none", got)
	}
}

// TestGrantSandboxDevice gives nobody a root 0600 character device found beneath a process's
// root, and refuses a path through a symlink or to what is not a device.
func TestGrantSandboxDevice(t *testing.T) {
	testenv.Root(t, "makes a device node and opens it as nobody")
	u, err := lookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "net", "tun")
	if err := os.Mkdir(filepath.Dir(dev), 0o755); err != nil {
		t.Fatal(err)
	}
	// A node of /dev/null's numbers: opening it has no side effect.
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	// The way to it, as a pod's /dev is (0755 directories).
	if err := grantDir(u, filepath.Dir(dev)); err != nil {
		t.Fatal(err)
	}
	if err := accessAs(u, dev, true); err == nil {
		t.Fatal("nobody opened a root 0600 device before the grant: the test proves nothing here")
	}
	rel := strings.TrimPrefix(dev, "/")
	if err := grantSandboxDevice(u, os.Getpid(), rel); err != nil {
		t.Fatal(err)
	}
	if err := accessAs(u, dev, true); err != nil {
		t.Errorf("after the grant: %v", err)
	}
	if err := os.Symlink(filepath.Join(dir, "net"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := grantSandboxDevice(u, os.Getpid(), strings.TrimPrefix(filepath.Join(dir, "link", "tun"), "/")); err == nil {
		t.Error("a path through a symlink was followed")
	}
	if err := grantSandboxDevice(u, os.Getpid(), strings.TrimPrefix(dir, "/")); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("a directory: %v, want not a character device", err)
	}
}
