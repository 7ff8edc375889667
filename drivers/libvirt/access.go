package libvirt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// The VM's QEMU runs as Config.User, and the files it opens (disk images and their qcow2
// backing files, kernels, the run dir where it binds its sockets) are the node's, made by root
// in root's 0700 directories. The driver lets the user reach them with POSIX ACL entries for
// that user alone: search (x) on each directory on the way that the user cannot pass, read (and
// write for a writable disk) on the file. Nothing else gains access, and the files' owners and
// modes stay as their makers left them. Entries on directories that other VMs' files share
// (the state dir, /tmp) stay when a VM is deleted: they let that one user pass, not list.
//
// The ACL is written as its extended attribute (system.posix_acl_access, the kernel's
// posix_acl_xattr format) rather than through libacl or setfacl: the format is a small stable
// kernel ABI, and neither a cgo library nor a command in the launcher and handler images is
// needed for the few entries the driver adds.

const aclXattr = "system.posix_acl_access"

// ACL entry tags and the version of the xattr format (linux/posix_acl_xattr.h).
const (
	aclVersion  = 2
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclNoID     = 0xFFFFFFFF
)

// Permissions of an ACL entry.
const (
	permX = 1
	permW = 2
	permR = 4
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// grantAccess lets u open path (read, and write when write) and pass every directory above it.
func grantAccess(u vmUser, path string, write bool) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for _, dir := range ancestors(abs) {
		if err := grant(u, dir, permX); err != nil {
			return err
		}
	}
	perm := uint16(permR)
	if write {
		perm |= permW
	}
	return grant(u, abs, perm)
}

// grantDir lets u pass every directory above dir and use dir itself (list, search, and make
// and remove entries: QEMU binds its sockets there).
func grantDir(u vmUser, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for _, a := range ancestors(abs) {
		if err := grant(u, a, permX); err != nil {
			return err
		}
	}
	return grant(u, abs, permR|permW|permX)
}

// ancestors are the directories above path, from the root down.
func ancestors(path string) []string {
	var out []string
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		out = append(out, p)
		if p == "/" || p == "." {
			break
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// grant gives u the permissions perm on path (following a symlink to its target), unless u has
// them already by the mode bits; it widens an ACL entry of u's, never narrows one.
func grant(u vmUser, path string, perm uint16) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("grant %s access to %s: %w", u.Name, path, err)
	}
	if modePerm(st, u)&perm == perm {
		return nil
	}
	entries, err := readACL(path, st.Mode)
	if err != nil {
		return fmt.Errorf("grant %s access to %s: %w", u.Name, path, err)
	}
	entries, changed := addUser(entries, uint32(u.UID), perm)
	if !changed {
		return nil
	}
	if err := unix.Setxattr(path, aclXattr, encodeACL(entries), 0); err != nil {
		return fmt.Errorf("grant %s access to %s: set ACL: %w", u.Name, path, err)
	}
	return nil
}

// modePerm is what the mode bits alone give u on a file (ACL entries aside).
func modePerm(st unix.Stat_t, u vmUser) uint16 {
	switch {
	case int(st.Uid) == u.UID:
		return uint16(st.Mode>>6) & 7
	case int(st.Gid) == u.GID:
		return uint16(st.Mode>>3) & 7
	}
	return uint16(st.Mode) & 7
}

// readACL is path's access ACL, or the three entries its mode stands for when it has none.
func readACL(path string, mode uint32) ([]aclEntry, error) {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, aclXattr, buf)
	if errors.Is(err, unix.ENODATA) {
		return []aclEntry{
			{tag: aclUserObj, perm: uint16(mode>>6) & 7, id: aclNoID},
			{tag: aclGroupObj, perm: uint16(mode>>3) & 7, id: aclNoID},
			{tag: aclOther, perm: uint16(mode) & 7, id: aclNoID},
		}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ACL: %w", err)
	}
	return decodeACL(buf[:n])
}

func decodeACL(b []byte) ([]aclEntry, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 || binary.LittleEndian.Uint32(b) != aclVersion {
		return nil, fmt.Errorf("read ACL: not a version %d POSIX ACL (%d bytes)", aclVersion, len(b))
	}
	var out []aclEntry
	for off := 4; off < len(b); off += 8 {
		out = append(out, aclEntry{
			tag:  binary.LittleEndian.Uint16(b[off:]),
			perm: binary.LittleEndian.Uint16(b[off+2:]),
			id:   binary.LittleEndian.Uint32(b[off+4:]),
		})
	}
	return out, nil
}

func encodeACL(entries []aclEntry) []byte {
	b := make([]byte, 4+8*len(entries))
	binary.LittleEndian.PutUint32(b, aclVersion)
	for i, e := range entries {
		off := 4 + 8*i
		binary.LittleEndian.PutUint16(b[off:], e.tag)
		binary.LittleEndian.PutUint16(b[off+2:], e.perm)
		binary.LittleEndian.PutUint32(b[off+4:], e.id)
	}
	return b
}

// addUser adds perm to uid's entry (made when missing) and to the mask, which the kernel
// requires once there is a named entry and which bounds what named entries and the group get.
// An ACL without a mask gets one of the group's and the named entries' permissions, so the
// group keeps exactly what it had. It reports whether anything changed. Entries stay in the
// kernel's order (tag, then id).
func addUser(entries []aclEntry, uid uint32, perm uint16) ([]aclEntry, bool) {
	out := append([]aclEntry(nil), entries...)
	changed := false
	found, mask := false, -1
	for i := range out {
		switch {
		case out[i].tag == aclUser && out[i].id == uid:
			found = true
			if out[i].perm&perm != perm {
				out[i].perm |= perm
				changed = true
			}
		case out[i].tag == aclMask:
			mask = i
		}
	}
	if !found {
		out = append(out, aclEntry{tag: aclUser, perm: perm, id: uid})
		changed = true
	}
	if mask < 0 {
		m := uint16(0)
		for _, e := range out {
			if e.tag == aclGroupObj || e.tag == aclUser || e.tag == aclGroup {
				m |= e.perm
			}
		}
		out = append(out, aclEntry{tag: aclMask, perm: m, id: aclNoID})
		changed = true
	} else if out[mask].perm&perm != perm {
		out[mask].perm |= perm
		changed = true
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].tag != out[j].tag {
			return out[i].tag < out[j].tag
		}
		return out[i].id < out[j].id
	})
	return out, changed
}

// qcow2Backing is the backing file a qcow2 image names (resolved against the image's
// directory), or "" for a raw image, a qcow2 image without one, or one that cannot be read
// (QEMU reports that itself, naming the file).
func qcow2Backing(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	// The header: magic "QFI\xfb", version, backing_file_offset (u64), backing_file_size
	// (u32), big-endian.
	var hdr [20]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || string(hdr[:4]) != "QFI\xfb" {
		return ""
	}
	off := binary.BigEndian.Uint64(hdr[8:])
	size := binary.BigEndian.Uint32(hdr[16:])
	if off == 0 || size == 0 || size > 1023 {
		return ""
	}
	name := make([]byte, size)
	if _, err := f.ReadAt(name, int64(off)); err != nil {
		return ""
	}
	b := string(name)
	if !filepath.IsAbs(b) {
		b = filepath.Join(filepath.Dir(path), b)
	}
	return b
}

// reachable grants u access to path (grantAccess) and opens it as u (accessAs), so that an
// error names the file u cannot open.
func reachable(u vmUser, path string, write bool) error {
	if err := grantAccess(u, path, write); err != nil {
		return err
	}
	return accessAs(u, path, write)
}

// grantSandboxDevice gives u read-write access to the device node dev ("dev/net/tun") as the
// sandbox of process pid sees it: the node in a launcher pod's own /dev, which the runtime made
// with the host node's mode (root's 0600 on some hosts), where libvirt and QEMU open it as u.
// The path is resolved beneath /proc/<pid>/root without following any symlink, so a pod
// cannot point the grant elsewhere. Without a launcher (the daemon on the host) it is the
// host's own node: the user gets access to it there.
func grantSandboxDevice(u vmUser, pid int, dev string) error {
	root, err := unix.Open(filepath.Join("/proc", strconv.Itoa(pid), "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the sandbox's root: %w", err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, dev, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("/%s in the sandbox: %w", dev, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("/%s in the sandbox: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("/%s in the sandbox is not a character device", dev)
	}
	// The descriptor's magic link reaches the node itself (grant follows it).
	if err := grant(u, "/proc/self/fd/"+strconv.Itoa(fd), permR|permW); err != nil {
		return fmt.Errorf("/%s in the sandbox: %w", dev, err)
	}
	return nil
}
