package cluster

import (
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// What the containerDisk disks (containerdisk.go) and the claims (claims.go) share: both are a
// path in a process of the launcher pod, found in that process's root and mounted from its
// mount namespace onto a path of the per-VMI directory, which the launcher container sees at
// the same path.

// containerRoot is the root directory of a container's process (/proc/<pid>/root), in which
// open resolves every path, symlinks too (openat2 RESOLVE_IN_ROOT), so that a symlink in the
// container cannot name a file of the node.
type containerRoot struct {
	fd   int
	path string
}

// openRoot opens root, the root directory of a container's process.
func openRoot(root string) (*containerRoot, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the container's root: %w", err)
	}
	return &containerRoot{fd: fd, path: root}, nil
}

// procRoot opens the root of process pid.
func procRoot(pid int) (*containerRoot, error) { return openRoot(fmt.Sprintf("/proc/%d/root", pid)) }

// open opens p in the root with flags (O_CLOEXEC added). An error is a *os.PathError naming p
// as the container has it.
func (r *containerRoot) open(p string, flags uint64) (*os.File, error) {
	p = path.Clean("/" + p)
	fd, err := unix.Openat2(r.fd, strings.TrimPrefix(p, "/"), &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), r.path+p), nil
}

func (r *containerRoot) Close() { _ = unix.Close(r.fd) }

// sameFile says whether target is the file f (f is mounted there already).
func sameFile(f *os.File, target string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return false, err
	}
	if err := unix.Lstat(target, &b); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// cloneFrom clones the mount of src, a file or directory of process pid's mount namespace, as
// a detached mount (open_tree OPEN_TREE_CLONE) that the handler's mount namespace can attach,
// nosuid, nodev, noexec, and read-only when readOnly. A bind mount of a path of another mount
// namespace is refused by mount(2); open_tree is called on a thread that joined pid's mount
// namespace.
func cloneFrom(pid int, src *os.File, readOnly bool) (int, error) {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mount namespace: %w", err)
	}
	defer unix.Close(ns)
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread joins the container's mount namespace, then goes back to its own. It is
		// never unlocked, so no other goroutine runs on it: it ends with the goroutine (its
		// root and cwd are its own after CLONE_FS, which setns into a mount namespace needs).
		// Going back matters even so: the runtime does not end the main thread but parks it,
		// and /proc/self/mountinfo is the main thread's view.
		runtime.LockOSThread()
		own, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{-1, fmt.Errorf("own mount namespace: %w", err)}
			return
		}
		defer unix.Close(own)
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			ch <- result{-1, fmt.Errorf("unshare CLONE_FS: %w", err)}
			return
		}
		if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
			ch <- result{-1, fmt.Errorf("setns: %w", err)}
			return
		}
		fd, err := unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err != nil {
			err = fmt.Errorf("open_tree: %w", err)
		}
		if berr := unix.Setns(own, unix.CLONE_NEWNS); berr != nil {
			// The clone is fine, but a thread left in the container's namespace (the main
			// thread, parked) would pin it: give up rather than leave it there silently.
			err = errors.Join(err, fmt.Errorf("setns back: %w", berr))
			if fd >= 0 {
				_ = unix.Close(fd)
				fd = -1
			}
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	runtime.KeepAlive(src)
	if r.err != nil {
		return -1, r.err
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
	if readOnly {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(r.fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attr}); err != nil {
		_ = unix.Close(r.fd)
		return -1, fmt.Errorf("mount_setattr: %w", err)
	}
	return r.fd, nil
}

// bindFrom mounts src, a file of process pid's mount namespace, read-only on target in the
// handler's mount namespace.
func bindFrom(pid int, src *os.File, target string) error {
	tree, err := cloneFrom(pid, src, true)
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// unmountAll unmounts whatever is mounted on target, however many times, and then the copies
// mount propagation made of those mounts elsewhere in this mount namespace. The per-VMI
// directory is bound from the kubelet's pods directory (vmidir.go), both shared, so a mount
// in it is also mounted on the same file under the agent's view of the pods directory; a
// mount point that is still one anywhere in the namespace cannot be removed (EBUSY). A copy
// is a mount of the same file of the same file system (mountinfo's device and root) on a
// mount point of the same name. A symlink at target is not followed.
func unmountAll(target string) error {
	copies := propagatedCopies(target)
	if err := unmountHere(target); err != nil {
		return err
	}
	for _, c := range copies {
		if err := unmountHere(c); err != nil {
			return err
		}
	}
	return nil
}

// propagatedCopies lists the other mount points of what is mounted on target (see unmountAll).
func propagatedCopies(target string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	type src struct{ dev, root string }
	var entries [][3]string // dev, root, mount point
	mounted := map[src]bool{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		e := [3]string{f[2], f[3], unescapeMountinfo(f[4])}
		entries = append(entries, e)
		if e[2] == target {
			mounted[src{e[0], e[1]}] = true
		}
	}
	var out []string
	for _, e := range entries {
		if mounted[src{e[0], e[1]}] && e[2] != target && path.Base(e[2]) == path.Base(target) && !slices.Contains(out, e[2]) {
			out = append(out, e[2])
		}
	}
	return out
}

// unmountHere unmounts whatever is mounted on target, however many times.
func unmountHere(target string) error {
	for range 32 {
		err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", target)
}
