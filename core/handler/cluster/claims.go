package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// podClaims makes the claims of the node's VMIs reachable from the node handler's storage
// driver and from the VM process, as the containerDisk disks are (containerDisks). The launcher
// pod's compute container has the claim of each persistentVolumeClaim and ephemeral volume at
// layout.ClaimDir, mounted by the kubelet in that container's mount namespace only, and the VM's
// persistent state claim, when it has one, at layout.VMStateDir. MountAll and MountState find
// those directories in the launcher process's root (openat2 RESOLVE_IN_ROOT, so that a symlink
// in the container cannot name a directory of the node), clone their mounts with open_tree(2)
// from that mount namespace and attach them with move_mount(2) at layout.ClaimMount and
// layout.StateMount in the per-VMI directory, which the compute container sees at the same
// path. A read-only claim (persistentVolumeClaim.readOnly, and every ephemeral volume's
// backing claim) is mounted read-only.
//
// The mount points are made and opened in the per-VMI directory without following symlinks,
// since the pod can write there: a symlink planted there cannot make the handler mount over a
// directory of the node.
type podClaims struct {
	root string // the host state directory (package layout)
	// log and warnOnce: MountAll checks the propagation of root once (warnPropagation), shared
	// with containerDisks.
	log      logr.Logger
	warnOnce *sync.Once
}

// Path is the node path of a volume's claim once MountAll has mounted it.
func (c podClaims) Path(uid types.UID, volume string) string {
	return layout.ClaimMount(c.root, uid, volume)
}

// StatePath is the node path of the VMI's persistent state once MountState has mounted it.
func (c podClaims) StatePath(uid types.UID) string { return layout.StateMount(c.root, uid) }

// claimVolume is a volume of a VMI backed by a claim.
type claimVolume struct {
	volume, claim string
	readOnly      bool
}

// claimVolumes lists the VMI's persistentVolumeClaim and ephemeral volumes, in spec order.
func claimVolumes(vmi *v1alpha1.VirtualMachineInstance) []claimVolume {
	var out []claimVolume
	for _, v := range vmi.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, claimVolume{volume: v.Name, claim: v.PersistentVolumeClaim.ClaimName, readOnly: v.PersistentVolumeClaim.ReadOnly})
		case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
			// Only the backing image of a copy-on-write layer: nothing writes to it (the launcher
			// pod mounts it read-only too).
			out = append(out, claimVolume{volume: v.Name, claim: v.Ephemeral.PersistentVolumeClaim.ClaimName, readOnly: true})
		}
	}
	return out
}

// MountAll mounts the claim of every persistentVolumeClaim and ephemeral volume of the VMI
// from the root of the launcher process pid (Mount).
func (c podClaims) MountAll(_ context.Context, vmi *v1alpha1.VirtualMachineInstance, pid int) error {
	for _, v := range claimVolumes(vmi) {
		warnPropagation(c.root, c.log, c.warnOnce)
		if err := c.Mount(pid, vmi.UID, v.volume, v.readOnly); err != nil {
			return fmt.Errorf("volume %s (claim %s): %w", v.volume, v.claim, err)
		}
	}
	return nil
}

// Mount mounts the directory layout.ClaimDir(volume) of the root of process pid at Path,
// read-only when readOnly (or when the container has it read-only). It does nothing when
// that directory is mounted there already, as asked, and replaces another.
func (c podClaims) Mount(pid int, uid types.UID, volume string, readOnly bool) error {
	// The webhook checks this too; the handler makes paths of it and mounts there.
	if errs := validation.IsDNS1123Label(volume); len(errs) > 0 {
		return fmt.Errorf("volume name %q: %s", volume, strings.Join(errs, "; "))
	}
	return c.mount(pid, layout.ClaimDir(volume), uid, volume, readOnly)
}

// MountState mounts the directory layout.VMStateDir of the root of process pid at StatePath,
// read-write, and returns StatePath; as Mount, it does nothing when it is mounted there
// already.
func (c podClaims) MountState(pid int, uid types.UID) (string, error) {
	if err := c.mount(pid, layout.VMStateDir, uid, filepath.Base(c.StatePath(uid)), false); err != nil {
		return "", err
	}
	return c.StatePath(uid), nil
}

// mount mounts dir of process pid's root at name in the VMI's claims directory.
func (c podClaims) mount(pid int, dir string, uid types.UID, name string, readOnly bool) error {
	root, err := procRoot(pid)
	if err != nil {
		return fmt.Errorf("root of the launcher process: %w", err)
	}
	defer root.Close()
	src, err := root.open(dir, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("the launcher pod has nothing mounted at %s (a launcher pod made before the VMI had it?): %w", dir, err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s in the launcher pod is not a directory (only file-system claims are supported): %w", dir, err)
	case err != nil:
		return fmt.Errorf("%s in the launcher pod: %w", dir, err)
	}
	defer src.Close()
	if ro, err := readOnlyMount(src); err != nil {
		return fmt.Errorf("%s in the launcher pod: %w", dir, err)
	} else if ro {
		readOnly = true
	}
	target := filepath.Join(layout.VMIDir(c.root, uid), layout.ClaimsDirName, name)
	if ok, err := c.mountedAs(uid, name, src, readOnly); err != nil {
		return err
	} else if ok {
		return nil
	}
	if err := c.unmount(uid, name); err != nil {
		return err
	}
	point, err := c.mountPoint(uid, name)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	defer point.Close()
	tree, err := cloneFrom(pid, src, readOnly)
	if err != nil {
		return fmt.Errorf("mount %s of the launcher (pid %d) on %s: %w", dir, pid, target, err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", int(point.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount %s of the launcher (pid %d) on %s: move_mount: %w", dir, pid, target, err)
	}
	return nil
}

// mountPoint makes (when missing) and opens the directory name in the VMI's claims directory,
// following no symlink below the per-VMI directory.
func (c podClaims) mountPoint(uid types.UID, name string) (*os.File, error) {
	vmiDir := layout.VMIDir(c.root, uid)
	if err := os.MkdirAll(vmiDir, 0o755); err != nil {
		return nil, err
	}
	dirFd, err := unix.Open(vmiDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirFd)
	// Each level made (mkdirat does not follow a symlink in the last element), then opened
	// without following one, and the next made in it.
	beneath := func(at int, rel string) (int, error) {
		if err := unix.Mkdirat(at, rel, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		return unix.Openat2(at, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
	}
	claimsFd, err := beneath(dirFd, layout.ClaimsDirName)
	if err != nil {
		return nil, err
	}
	defer unix.Close(claimsFd)
	fd, err := beneath(claimsFd, name)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(vmiDir, layout.ClaimsDirName, name)), nil
}

// readOnlyMount says whether f is on a read-only mount.
func readOnlyMount(f *os.File) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false, err
	}
	return st.Flags&unix.ST_RDONLY != 0, nil
}

// openBeneath opens (O_PATH) rel in the VMI's directory, following no symlink: the pod can
// write there.
func (c podClaims) openBeneath(uid types.UID, rel string) (*os.File, error) {
	vmiDir := layout.VMIDir(c.root, uid)
	dirFd, err := unix.Open(vmiDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirFd)
	fd, err := unix.Openat2(dirFd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(vmiDir, rel), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(vmiDir, rel)), nil
}

// mountedAs says whether name in the VMI's claims directory is the directory src, mounted
// read-only exactly when readOnly.
func (c podClaims) mountedAs(uid types.UID, name string, src *os.File, readOnly bool) (bool, error) {
	f, err := c.openBeneath(uid, filepath.Join(layout.ClaimsDirName, name))
	if err != nil {
		return false, nil // not there, or not ours as it is: mount makes it anew
	}
	defer f.Close()
	var a, b unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &a); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		return false, err
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return false, nil
	}
	ro, err := readOnlyMount(f)
	return err == nil && ro == readOnly, err
}

// unmount unmounts whatever is mounted on name in the VMI's claims directory, however many
// times, following no symlink (through the mount's descriptor, which umount2 takes as
// /proc/self/fd/<fd>).
func (c podClaims) unmount(uid types.UID, name string) error {
	rel := filepath.Join(layout.ClaimsDirName, name)
	// And the copies mount propagation made of it (podmount.go, unmountAll), once it is gone.
	copies := propagatedCopies(filepath.Join(layout.VMIDir(c.root, uid), rel))
	defer func() {
		for _, p := range copies {
			_ = unmountHere(p)
		}
	}()
	for range 32 {
		f, err := c.openBeneath(uid, rel)
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return nil // a symlink: nothing of ours is mounted through it
		case err != nil:
			return err
		}
		err = unix.Unmount(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.MNT_DETACH)
		_ = f.Close()
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmount %s: %w", f.Name(), err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", filepath.Join(layout.VMIDir(c.root, uid), rel))
}

// Release unmounts the claims and the persistent state of a VMI and removes their mount
// points. The VM must be gone (after Handler.Stop). A mount point is removed only once empty
// (rmdir), so a claim that could not be unmounted keeps its data; a symlink in place of the
// claims directory is removed, never followed.
func (c podClaims) Release(uid types.UID) error {
	dir := filepath.Join(layout.VMIDir(c.root, uid), layout.ClaimsDirName)
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return os.Remove(dir) // not ours: nothing mounts through it
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if err := c.unmount(uid, e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		// Only an empty directory or a symlink goes (a symlink is removed, not followed).
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
