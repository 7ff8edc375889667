package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/cluster/containerdisk"
	"github.com/kubevisor/kubevisor/core/layout"
)

// containerDisks makes the containerDisk volumes of the node's VMIs reachable from their
// launcher containers, as KubeVirt's virt-handler does. Each volume has a container in the
// launcher pod running its image with kubevisor-containerdisk as the command, which serves
// layout.ContainerDiskSocket in the per-VMI directory. Mount dials that socket, takes the serving
// process's pid from the connection (SO_PEERCRED: the handler needs the host's pid namespace),
// finds the disk in that process's root (/disk/<the single file>, or the path the volume names)
// and bind-mounts it, read-only, onto layout.ContainerDiskImage in the per-VMI directory, which the
// launcher container sees at the same path (the pod's hostPath mount has HostToContainer
// propagation). The storage driver then makes its copy-on-write overlay over that file.
//
// The disk is found by resolving the path inside the container's root (openat2
// RESOLVE_IN_ROOT), so that a symlink in the image cannot name a file of the node. A bind mount
// of a file of another mount namespace is refused by mount(2); Mount clones the file's mount
// with open_tree(2) on a thread that joined the container's mount namespace, then attaches the
// clone with move_mount(2) in the handler's own.
type containerDisks struct {
	root    string        // the host state directory (package layout)
	timeout time.Duration // the wait for a container's socket
	// log and warnOnce: MountAll checks the propagation of root once (warnPropagation), with
	// the claims' mounts (podClaims).
	log      logr.Logger
	warnOnce *sync.Once
}

// Path is the node path of a containerDisk volume's disk once Mount has mounted it.
func (c containerDisks) Path(uid types.UID, volume string) string {
	return layout.ContainerDiskImage(c.root, uid, volume)
}

// MountAll mounts the disk of every containerDisk volume of the VMI (Mount).
func (c containerDisks) MountAll(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	for _, v := range vmi.Spec.Volumes {
		if v.ContainerDisk == nil {
			continue
		}
		warnPropagation(c.root, c.log, c.warnOnce)
		if err := c.Mount(ctx, vmi.UID, v.Name, v.ContainerDisk.Path); err != nil {
			return fmt.Errorf("containerDisk volume %s: %w", v.Name, err)
		}
	}
	return nil
}

// Mount mounts the disk of one containerDisk volume at Path, read-only; inImage is the disk's
// path in the image ("": the single file under /disk/). It does nothing when that disk is
// mounted there already, and replaces another.
func (c containerDisks) Mount(ctx context.Context, uid types.UID, volume, inImage string) error {
	// The webhook checks this too; the handler makes paths of it and mounts there.
	if errs := validation.IsDNS1123Label(volume); len(errs) > 0 {
		return fmt.Errorf("volume name %q: %s", volume, strings.Join(errs, "; "))
	}
	socket := layout.ContainerDiskSocket(c.root, uid, volume)
	pid, conn, err := c.dial(ctx, socket)
	if err != nil {
		return err
	}
	// Held open until the disk is mounted, so the container runs while its root is used.
	defer conn.Close()
	disk, shown, err := findDisk(pid, inImage)
	if err != nil {
		return err
	}
	defer disk.Close()
	target := c.Path(uid, volume)
	if same, err := sameFile(disk, target); err != nil {
		return err
	} else if same {
		return nil
	}
	if err := unmountAll(target); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_RDONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("mount point: %w", err)
	}
	_ = f.Close()
	if err := bindFrom(pid, disk, target); err != nil {
		return fmt.Errorf("mount %s of the container (pid %d) on %s: %w", shown, pid, target, err)
	}
	return nil
}

// dial connects to a containerDisk container's socket, waiting for it up to the timeout, and
// returns the pid of the process serving it, with the connection.
func (c containerDisks) dial(ctx context.Context, socket string) (int, *net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", socket)
		if err == nil {
			uc := conn.(*net.UnixConn)
			pid, err := peerPid(uc)
			if err != nil {
				_ = uc.Close()
				return 0, nil, err
			}
			if pid <= 0 {
				_ = uc.Close()
				return 0, nil, fmt.Errorf("the process serving %s is not visible from the handler (the handler needs the host's pid namespace)", socket)
			}
			return pid, uc, nil
		}
		select {
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("its container does not serve %s (is it running?): %w", socket, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func peerPid(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return int(cred.Pid), nil
}

// findDisk opens (O_PATH) the disk in the root of process pid: inImage, else the single file
// under /disk/. Paths resolve inside that root, symlinks too. shown names the disk in errors.
func findDisk(pid int, inImage string) (*os.File, string, error) {
	root, err := procRoot(pid)
	if err != nil {
		return nil, "", fmt.Errorf("root of the container's process: %w", err)
	}
	defer root.Close()
	in := root.open
	regular := func(f *os.File) bool {
		fi, err := f.Stat()
		return err == nil && fi.Mode().IsRegular()
	}
	if inImage != "" {
		f, err := in(inImage, unix.O_PATH)
		if err != nil {
			return nil, "", fmt.Errorf("the image's disk: %w", err)
		}
		if !regular(f) {
			_ = f.Close()
			return nil, "", fmt.Errorf("%s in the image is not a regular file", inImage)
		}
		return f, inImage, nil
	}
	dir, err := in(containerdisk.DiskDir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, "", fmt.Errorf("the image has no %s/ (KubeVirt's containerDisk layout): %w", containerdisk.DiskDir, err)
	}
	names, err := dir.Readdirnames(-1)
	_ = dir.Close()
	if err != nil {
		return nil, "", fmt.Errorf("read %s: %w", containerdisk.DiskDir, err)
	}
	var found []*os.File
	var foundNames []string
	for _, n := range names {
		f, err := in(path.Join(containerdisk.DiskDir, n), unix.O_PATH)
		if err != nil {
			continue
		}
		if !regular(f) {
			_ = f.Close()
			continue
		}
		found = append(found, f)
		foundNames = append(foundNames, n)
	}
	if len(found) != 1 {
		for _, f := range found {
			_ = f.Close()
		}
		return nil, "", fmt.Errorf("%s/ of the image holds %d files %v: a containerDisk has exactly one, or the volume names its path", containerdisk.DiskDir, len(found), foundNames)
	}
	shown := path.Join(containerdisk.DiskDir, foundNames[0])
	return found[0], shown, nil
}

// Release unmounts the containerDisk disks of a VMI and removes their mount points. The VM
// must be gone (after Handler.Stop): an open disk stays readable (the unmount is lazy) but a
// new open fails.
func (c containerDisks) Release(uid types.UID) error {
	dir := layout.ContainerDiskDir(c.root, uid)
	imgs, err := filepath.Glob(filepath.Join(dir, "*.img"))
	if err != nil {
		return err
	}
	var errs []error
	for _, img := range imgs {
		if err := unmountAll(img); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// diskResolver is the agent's handler.ContainerDiskResolver: a containerDisk volume's disk is
// where containerDisks mounts it (the sandbox lookup mounts it, before the storage driver runs).
type diskResolver struct {
	disks containerDisks
}

var _ handler.ContainerDiskResolver = diskResolver{}

// ContainerDisk implements handler.ContainerDiskResolver.
func (r diskResolver) ContainerDisk(_ context.Context, vmi *v1alpha1.VirtualMachineInstance, volume string, _ *v1alpha1.ContainerDiskSource) (string, error) {
	return r.disks.Path(vmi.UID, volume), nil
}

// propagationOf returns the mount point of the mount that holds p, as mountinfo lists them,
// and whether that mount is shared (propagates the mounts made under it to its peers). The
// disks mounted under the host state directory reach the launcher containers only when it is:
// the handler's DaemonSet mounts the directory with Bidirectional propagation, which needs the
// node's mount to be shared.
func propagationOf(mountinfo, p string) (mountPoint string, shared bool) {
	best := -1
	for line := range strings.SplitSeq(mountinfo, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 7 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp != "/" && p != mp && !strings.HasPrefix(p, mp+"/") {
			continue
		}
		if len(mp) < best {
			continue
		}
		best = len(mp)
		mountPoint, shared = mp, false
		// Optional fields until "-": shared:N, master:N, propagate_from:N, unbindable.
		for _, f := range fields[6:] {
			if f == "-" {
				break
			}
			if strings.HasPrefix(f, "shared:") {
				shared = true
			}
		}
	}
	return mountPoint, shared
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// warnPropagation logs, the first time once is done, what checkPropagation finds wrong.
func warnPropagation(root string, log logr.Logger, once *sync.Once) {
	once.Do(func() {
		if err := checkPropagation(root); err != nil {
			log.Error(err, "containerDisk, persistentVolumeClaim and ephemeral volumes cannot work on this node")
		}
	})
}

// checkPropagation says, when the host state directory is not on a shared mount, that
// containerDisk disks and claims will not reach launcher containers. It is a warning, not an
// error: VMIs without such volumes run all the same.
func checkPropagation(root string) error {
	dir, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil // made later, by the first launcher pod
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	if mp, shared := propagationOf(string(data), dir); !shared {
		return fmt.Errorf("the host state directory %s is on mount %s, which is not shared: the disks of containerDisk volumes and the claims mounted there will not reach launcher containers (mount it into the handler with mountPropagation: Bidirectional, on a node whose mount is shared: mount --make-rshared /)", root, mp)
	}
	return nil
}
