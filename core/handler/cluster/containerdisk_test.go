package cluster

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// standInDirs makes, for a test as root, a directory under /tmp (removed at the end) with
// kubevisor-containerdisk built into its bin/ (the container stand-in's program) and the empty
// host/ a stand-in container's root is made in.
func standInDirs(t *testing.T, prefix string) (dir, bin, host string) {
	t.Helper()
	needRoot(t)
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin = filepath.Join(dir, "bin")
	if err := testbin.Build(bin, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-containerdisk"); err != nil {
		t.Fatal(err)
	}
	host = filepath.Join(dir, "host")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin, host
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.Root(t, "mount namespaces, setns, open_tree and move_mount")
}

// containerDiskStandIn starts a real kubevisor-containerdisk (built into bin) as a containerDisk
// container stands in for it: in a mount namespace of its own, chrooted into root, which holds
// the image's /disk/ and, at the same path as on the node, the host state directory hostDir
// (root is hostDir itself, so the socket path is the same inside and out). It serves the socket
// of the VMI's volume until the test ends.
func containerDiskStandIn(t *testing.T, bin, hostDir string, uid types.UID, volume string) *exec.Cmd {
	t.Helper()
	exe := filepath.Join(hostDir, layout.ContainerDiskCommand)
	if _, err := os.Stat(exe); err != nil {
		data, err := os.ReadFile(filepath.Join(bin, layout.ContainerDiskCommand))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exe, data, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	sock := layout.ContainerDiskSocket(hostDir, uid, volume)
	inside := "/" + strings.TrimPrefix(sock, hostDir+"/")
	return containerStandIn(t, hostDir, "/"+layout.ContainerDiskCommand, "--socket", inside)
}

// containerStandIn starts argv as a container's process stands in for one: in a mount
// namespace of its own (private: what is mounted in it stays there), chrooted into root. It
// runs until the test ends (SIGTERM).
func containerStandIn(t *testing.T, root string, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return cmd
}

// mountsUnder lists the mount points of this process's mount namespace under dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestContainerDisks mounts the disk of a real kubevisor-containerdisk process in a mount
// namespace of its own whose root holds /disk/: the single file under /disk/ is found through
// the socket's peer pid and mounted read-only at the volume's Image path, where it reads as the
// image's file; mounting again changes nothing; a path the volume names is used; a symlink in
// the image resolves inside the image, not on the node; /disk/ with two files and no path is
// an error; Release leaves nothing mounted and no mount point behind.
func TestContainerDisks(t *testing.T) {
	dir, bin, host := standInDirs(t, "kvc-")
	for name, data := range map[string]string{"disk/x.qcow2": "image x", "other/y.qcow2": "image y"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(host, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, name), []byte(data), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	// On the node, not in the image: what a symlink in the image must not reach.
	if err := os.WriteFile("/tmp/"+filepath.Base(dir)+"-secret", []byte("node secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove("/tmp/" + filepath.Base(dir) + "-secret") })
	if err := os.Symlink("/tmp/"+filepath.Base(dir)+"-secret", filepath.Join(host, "other", "evil")); err != nil {
		t.Fatal(err)
	}

	const uid = types.UID("0b1d6a4e-uid")
	proc := containerDiskStandIn(t, bin, host, uid, "root")
	self, _ := os.Readlink("/proc/self/ns/mnt")
	theirs, _ := os.Readlink("/proc/" + itoa(proc.Process.Pid) + "/ns/mnt")
	if self == theirs || theirs == "" {
		t.Fatalf("the stand-in is not in a mount namespace of its own (%q, %q)", self, theirs)
	}
	c := containerDisks{root: host, timeout: 10 * time.Second, log: testr.New(t), warnOnce: new(sync.Once)}
	ctx := context.Background()
	target := c.Path(uid, "root")
	if want := filepath.Join(host, "vmi", string(uid), "containerdisks", "root.img"); target != want {
		t.Fatalf("Path = %s, want %s", target, want)
	}
	read := func() string {
		t.Helper()
		data, err := os.ReadFile(target)
		if err != nil {
			t.Fatalf("read the mounted disk: %v", err)
		}
		return string(data)
	}

	if err := c.Mount(ctx, uid, "root", ""); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if now, _ := os.Readlink("/proc/self/ns/mnt"); now != self {
		t.Errorf("after Mount the process's (main thread's) mount namespace is %s, not %s", now, self)
	}
	if got := read(); got != "image x" {
		t.Errorf("mounted disk reads %q, want the image's /disk/x.qcow2", got)
	}
	if err := os.WriteFile(target, []byte("w"), 0o644); err == nil {
		t.Error("the mounted disk is writable")
	}
	if got := mountsUnder(t, host); len(got) != 1 || got[0] != target {
		t.Errorf("mounts under the host directory %v, want just %s", got, target)
	}
	if err := c.Mount(ctx, uid, "root", ""); err != nil {
		t.Fatalf("Mount again: %v", err)
	}
	if got := mountsUnder(t, host); len(got) != 1 {
		t.Errorf("mounting again: mounts %v, want one", got)
	}

	// A path the volume names replaces what is mounted.
	if err := c.Mount(ctx, uid, "root", "/other/y.qcow2"); err != nil {
		t.Fatalf("Mount a named path: %v", err)
	}
	if got := read(); got != "image y" {
		t.Errorf("after mounting /other/y.qcow2 the disk reads %q", got)
	}
	if got := mountsUnder(t, host); len(got) != 1 {
		t.Errorf("after replacing: mounts %v, want one", got)
	}

	// A symlink to an absolute path resolves in the image's root.
	if err := c.Mount(ctx, uid, "root", "/other/evil"); err == nil {
		t.Errorf("a symlink out of the image mounted: the disk reads %q", read())
	}

	// Two files under /disk/ and no path.
	if err := os.WriteFile(filepath.Join(host, "disk", "z.qcow2"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := c.Mount(ctx, uid, "root", ""); err == nil || !strings.Contains(err.Error(), "2 files") {
		t.Errorf("two files under /disk/: error %v, want one naming 2 files", err)
	}

	if err := c.Mount(ctx, uid, "../../x", ""); err == nil {
		t.Error("a volume name with a path in it: no error")
	}

	// No container serves the socket: an error once the timeout passes.
	short := containerDisks{root: host, timeout: 300 * time.Millisecond, log: testr.New(t), warnOnce: new(sync.Once)}
	if err := short.Mount(ctx, uid, "missing", ""); err == nil || !strings.Contains(err.Error(), "does not serve") {
		t.Errorf("no container: error %v", err)
	}

	if err := c.Release(uid); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := mountsUnder(t, host); len(got) != 0 {
		t.Errorf("mounts left after Release: %v", got)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point left after Release: %v", err)
	}
	if err := c.Release(uid); err != nil {
		t.Errorf("Release again: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestPropagationOf reads mountinfo: the longest mount point holding the path, shared when its
// optional fields say so; escaped mount points are unescaped.
func TestPropagationOf(t *testing.T) {
	const mountinfo = `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw
30 27 0:25 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
31 30 0:26 / /run/kubevisor rw,relatime master:7 - tmpfs tmpfs rw
32 27 0:27 / /srv/my\040dir rw,relatime - tmpfs tmpfs rw
`
	for _, tt := range []struct {
		path, mount string
		shared      bool
	}{
		{"/run/kubevisor/vmi/u", "/run/kubevisor", false},
		{"/run/kubevisor", "/run/kubevisor", false},
		{"/run/other", "/run", true},
		{"/runx", "/", true},
		{"/srv/my dir/x", "/srv/my dir", false},
		{"/var/lib/x", "/", true},
	} {
		mp, shared := propagationOf(mountinfo, tt.path)
		if mp != tt.mount || shared != tt.shared {
			t.Errorf("%s: mount %q shared %v, want %q %v", tt.path, mp, shared, tt.mount, tt.shared)
		}
	}
}
