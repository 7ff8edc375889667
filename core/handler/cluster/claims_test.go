package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// inMountNS runs f on a thread that joined process pid's mount namespace (as the kubelet's
// mounts of a container are made in the container's namespace only), then goes back: the
// thread is never unlocked, so it ends with its goroutine, but the main thread, should it be
// that one, is parked instead, and /proc/self/mountinfo is its view.
func inMountNS(t *testing.T, pid int, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(own)
		ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(ns)
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- err
			return
		}
		if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
			done <- err
			return
		}
		err = f()
		done <- errors.Join(err, unix.Setns(own, unix.CLONE_NEWNS))
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// claimStandIn makes a launcher container stand-in: a process in a mount namespace of its
// own, chrooted into host (a host state directory, so that paths of the per-VMI directory are
// the same inside and out), with a tmpfs mounted in its namespace only at the compute
// container's claim directory of each volume, holding a file "marker" that names the volume.
func claimStandIn(t *testing.T, bin, host string, uid types.UID, volumes ...string) int {
	t.Helper()
	proc := containerDiskStandIn(t, bin, host, uid, "launcher")
	pid := proc.Process.Pid
	for _, v := range volumes {
		claimInPod(t, pid, host, layout.ClaimDir(v), v)
	}
	return pid
}

// claimInPod mounts a tmpfs holding "marker" (the text what) at dir of the stand-in pid, in
// its mount namespace only.
func claimInPod(t *testing.T, pid int, host, dir, what string) {
	t.Helper()
	p := filepath.Join(host, dir)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	inMountNS(t, pid, func() error {
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=4m"); err != nil {
			return fmt.Errorf("mount the claim in the stand-in's namespace: %w", err)
		}
		return os.WriteFile(filepath.Join(p, "marker"), []byte(what), 0o644)
	})
}

// TestPodClaims mounts the claims of a VMI from a launcher stand-in whose mount namespace alone
// has them: each is mounted at the volume's ClaimMount, where it reads as the container's (not
// the node's empty directory); a read-write claim is written through to the container; a
// read-only one and an ephemeral volume's are read-only; mounting again changes nothing; a
// volume made read-only is mounted again read-only; a claim the pod lacks and a symlink planted
// at a mount point are errors that mount nothing; MountState mounts the state claim read-write
// and says what is missing without it; Release unmounts everything, removes the mount points and
// leaves the claims' data.
func TestPodClaims(t *testing.T) {
	dir, bin, host := standInDirs(t, "kvcl-")
	const uid = types.UID("5e1a-uid")
	pid := claimStandIn(t, bin, host, uid, "data", "golden", "shared")
	c := podClaims{root: host, log: testr.New(t), warnOnce: new(sync.Once)}
	ctx := context.Background()
	if want := filepath.Join(host, "vmi", string(uid), "claims", "data"); c.Path(uid, "data") != want {
		t.Fatalf("Path = %s, want %s", c.Path(uid, "data"), want)
	}
	read := func(volume string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(c.Path(uid, volume), "marker"))
		if err != nil {
			t.Fatalf("read the mounted claim of %s: %v", volume, err)
		}
		return string(data)
	}
	writable := func(volume string) error {
		return os.WriteFile(filepath.Join(c.Path(uid, volume), "disk.img"), []byte("guest"), 0o660)
	}
	// The node's own view of the claim directory is empty: the claim is the stand-in's.
	if _, err := os.Stat(filepath.Join(host, layout.ClaimDir("data"), "marker")); err == nil {
		t.Fatal("the claim is mounted in the test's namespace too: the test proves nothing")
	}

	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: uid}}
	vmi.Spec.Volumes = []v1alpha1.Volume{
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-pvc"}}}},
		{Name: "golden", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden-pvc"}}}},
		{Name: "shared", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "shared-pvc", ReadOnly: true}}}},
		{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{}}},
	}
	if err := c.MountAll(ctx, vmi, pid); err != nil {
		t.Fatalf("MountAll: %v", err)
	}
	for _, v := range []string{"data", "golden", "shared"} {
		if got := read(v); got != v {
			t.Errorf("%s: the mounted claim reads %q, want the stand-in's claim %q", v, got, v)
		}
	}
	if err := writable("data"); err != nil {
		t.Errorf("the read-write claim is not writable: %v", err)
	}
	// Written through to the claim as the container has it.
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/disk.img", pid, layout.ClaimDir("data"))); err != nil || string(data) != "guest" {
		t.Errorf("the container's claim has %q (%v), want what was written through the mount", data, err)
	}
	for _, v := range []string{"golden", "shared"} {
		if err := writable(v); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: writing to the read-only claim: %v, want EROFS", v, err)
		}
	}
	claimsDir := filepath.Join(host, "vmi", string(uid), "claims")
	if got := mountsUnder(t, host); len(got) != 3 {
		t.Errorf("mounts under the host directory %v, want the 3 claims", got)
	}
	if _, err := os.Stat(filepath.Join(claimsDir, "scratch")); err == nil {
		t.Error("a mount point for an emptyDisk volume")
	}

	// Again: nothing changes.
	if err := c.MountAll(ctx, vmi, pid); err != nil {
		t.Fatalf("MountAll again: %v", err)
	}
	if got := mountsUnder(t, host); len(got) != 3 {
		t.Errorf("mounting again: mounts %v, want 3", got)
	}
	// The same claim asked read-only: mounted again, read-only.
	if err := c.Mount(pid, uid, "data", true); err != nil {
		t.Fatalf("Mount read-only: %v", err)
	}
	if err := writable("data"); !errors.Is(err, syscall.EROFS) {
		t.Errorf("data mounted again read-only: writing: %v, want EROFS", err)
	}
	if got := mountsUnder(t, host); len(got) != 3 {
		t.Errorf("after replacing: mounts %v, want 3", got)
	}

	// A claim the pod lacks.
	if err := c.Mount(pid, uid, "missing", false); err == nil || !strings.Contains(err.Error(), "nothing mounted at "+layout.ClaimDir("missing")) {
		t.Errorf("a claim the pod lacks: error %v", err)
	}
	if err := c.Mount(pid, uid, "../x", false); err == nil {
		t.Error("a volume name with a path in it: no error")
	}
	// A symlink the pod planted at a mount point is not followed.
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.MkdirAll(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	claimInPod(t, pid, host, layout.ClaimDir("evil"), "evil")
	if err := os.Symlink(elsewhere, filepath.Join(claimsDir, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := c.Mount(pid, uid, "evil", false); err == nil {
		t.Error("mounted through a symlink at the mount point")
	}
	if got := mountsUnder(t, dir); len(got) != 3 {
		t.Errorf("after the symlink: mounts %v, want the 3 claims", got)
	}

	// The persistent state: missing, then mounted read-write.
	if _, err := c.MountState(pid, uid); err == nil || !strings.Contains(err.Error(), layout.VMStateDir) {
		t.Errorf("no state claim in the pod: error %v, want one naming %s", err, layout.VMStateDir)
	}
	claimInPod(t, pid, host, layout.VMStateDir, "state")
	state, err := c.MountState(pid, uid)
	if err != nil {
		t.Fatalf("MountState: %v", err)
	}
	if state != layout.StateMount(host, uid) {
		t.Errorf("MountState = %s, want %s", state, layout.StateMount(host, uid))
	}
	if data, err := os.ReadFile(filepath.Join(state, "marker")); err != nil || string(data) != "state" {
		t.Errorf("the state mount reads %q (%v)", data, err)
	}
	if err := os.WriteFile(filepath.Join(state, "tpm"), nil, 0o600); err != nil {
		t.Errorf("the state mount is not writable: %v", err)
	}
	if _, err := c.MountState(pid, uid); err != nil {
		t.Fatalf("MountState again: %v", err)
	}
	if got := mountsUnder(t, host); len(got) != 4 {
		t.Errorf("with the state: mounts %v, want 4", got)
	}

	if err := c.Release(uid); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := mountsUnder(t, host); len(got) != 0 {
		t.Errorf("mounts left after Release: %v", got)
	}
	if _, err := os.Lstat(claimsDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claims directory left after Release: %v", err)
	}
	if _, err := os.Stat(elsewhere); err != nil {
		t.Errorf("Release removed what a symlink named: %v", err)
	}
	// The claims keep their data.
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/disk.img", pid, layout.ClaimDir("data"))); err != nil || string(data) != "guest" {
		t.Errorf("after Release the container's claim has %q (%v)", data, err)
	}
	if err := c.Release(uid); err != nil {
		t.Errorf("Release again: %v", err)
	}

	// A symlink the pod planted in place of the claims directory is not followed either, and
	// Release removes it.
	if err := os.Symlink(elsewhere, claimsDir); err != nil {
		t.Fatal(err)
	}
	if err := c.Mount(pid, uid, "data", false); err == nil {
		t.Error("mounted through a symlinked claims directory")
	}
	if got := mountsUnder(t, dir); len(got) != 0 {
		t.Errorf("mounted through a symlinked claims directory: %v", got)
	}
	if _, err := os.Lstat(filepath.Join(elsewhere, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a mount point made through the symlinked claims directory (%v)", err)
	}
	if err := c.Release(uid); err != nil {
		t.Errorf("Release with a symlinked claims directory: %v", err)
	}
	if _, err := os.Lstat(claimsDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the symlink is left: %v", err)
	}
	if _, err := os.Stat(elsewhere); err != nil {
		t.Errorf("Release removed what the symlink named: %v", err)
	}
}

// TestPodResolverClaim: a claim resolves to the mount point of the volume that uses it,
// persistentVolumeClaim or ephemeral; a claim no volume uses is an error.
func TestPodResolverClaim(t *testing.T) {
	a := &Agent{claims: podClaims{root: "/var/run/kv"}}
	r := podResolver{a: a}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "u1"}}
	vmi.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "x"}}},
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-pvc"}}}},
		{Name: "golden", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden-pvc"}}}},
	}
	for claim, want := range map[string]string{
		"data-pvc":   "/var/run/kv/vmi/u1/claims/data",
		"golden-pvc": "/var/run/kv/vmi/u1/claims/golden",
	} {
		got, err := r.Claim(context.Background(), vmi, claim)
		if err != nil || got != want {
			t.Errorf("Claim(%s) = %q, %v; want %s", claim, got, err, want)
		}
	}
	if _, err := r.Claim(context.Background(), vmi, "other"); err == nil {
		t.Error("a claim no volume uses: no error")
	}
}

// TestPodResolverPersistentState runs a real kubevisor-launcher as the compute container's
// stand-in (chrooted into the host state directory, in a mount namespace of its own, with the
// node's /proc), and asks the resolver for the VMI's persistent state: without a state claim in
// the pod, an error naming where it should be; with one (mounted in the launcher's namespace
// only), the StateMount path, where the claim is mounted read-write; asked again, the same
// mount. The agent's release of the VMI's mounts unmounts it.
func TestPodResolverPersistentState(t *testing.T) {
	needRoot(t)
	dir, err := os.MkdirTemp("/tmp", "kvps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	host := filepath.Join(dir, "host")
	// A static launcher, to run in a root that has no libc.
	t.Setenv("CGO_ENABLED", "0")
	if err := testbin.Build(host, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	// The launcher reads its namespaces in /proc/self/ns.
	hostProc := filepath.Join(host, "proc")
	if err := os.MkdirAll(hostProc, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc", hostProc, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(hostProc, unix.MNT_DETACH) })
	const uid = types.UID("7a7e-uid")
	if err := os.MkdirAll(layout.VMIDir(host, uid), 0o755); err != nil {
		t.Fatal(err)
	}
	inside := "/" + strings.TrimPrefix(layout.LauncherDir(host, uid), host+"/")
	proc := containerStandIn(t, host, "/kubevisor-launcher", "--dir", inside, "--vmi", "ns/vm")
	pid := proc.Process.Pid

	cfg, err := AgentConfig{NodeName: "n", HostStateDir: host, DialTimeout: 10 * time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// No launcher pod in the cache: the directory is the test's, as an earlier release's hostPath.
	a := &Agent{cfg: cfg, client: fake.NewClientBuilder().Build(), claims: podClaims{root: host, log: testr.New(t), warnOnce: new(sync.Once)},
		disks: containerDisks{root: host, timeout: time.Second, log: testr.New(t), warnOnce: new(sync.Once)}}
	r := podResolver{a: a}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: uid}}
	ctx := context.Background()

	if _, err := r.PersistentState(ctx, vmi); err == nil || !strings.Contains(err.Error(), "nothing mounted at "+layout.VMStateDir) {
		t.Errorf("no state claim in the pod: error %v, want one saying nothing is mounted at %s", err, layout.VMStateDir)
	}
	claimInPod(t, pid, host, layout.VMStateDir, "state")
	got, err := r.PersistentState(ctx, vmi)
	if err != nil {
		t.Fatalf("PersistentState: %v", err)
	}
	if want := layout.StateMount(host, uid); got != want {
		t.Errorf("PersistentState = %s, want %s", got, want)
	}
	if data, err := os.ReadFile(filepath.Join(got, "marker")); err != nil || string(data) != "state" {
		t.Errorf("the state mount reads %q (%v), want the launcher's state claim", data, err)
	}
	if err := os.WriteFile(filepath.Join(got, "efivars.fd"), []byte("vars"), 0o600); err != nil {
		t.Errorf("the state mount is not writable: %v", err)
	}
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/efivars.fd", pid, layout.VMStateDir)); err != nil || string(data) != "vars" {
		t.Errorf("the launcher's state claim has %q (%v), want what was written through the mount", data, err)
	}
	if _, err := r.PersistentState(ctx, vmi); err != nil {
		t.Fatalf("PersistentState again: %v", err)
	}
	if got := mountsUnder(t, layout.VMIDir(host, uid)); len(got) != 1 {
		t.Errorf("mounts in the VMI directory %v, want the state's alone", got)
	}
	if err := a.releaseMounts(uid); err != nil {
		t.Fatalf("releaseMounts: %v", err)
	}
	if got := mountsUnder(t, layout.VMIDir(host, uid)); len(got) != 0 {
		t.Errorf("mounts left after releaseMounts: %v", got)
	}
}

// TestAgentClaims runs a VMI with a persistentVolumeClaim volume through the agent, the real
// local storage driver and a real launcher in a mount namespace of its own, whose /var/run (a
// tmpfs of that namespace only) has the claim at the compute container's ClaimDir, empty, as a
// new file-system claim is: the claim is mounted at its ClaimMount before the storage driver
// runs, which makes disk.img in it, sized from status.volumeStatus (64Mi less 5.5%, rounded
// down to MiB: 60 MiB); once the pod is deleted and the VM stopped, nothing is mounted any more
// and the claims directory is gone, while the claim keeps its disk.img.
func TestAgentClaims(t *testing.T) {
	needRoot(t)
	n := newAgentNode(t, true)
	ctx := context.Background()
	vmi := n.vmiWith("pvc", func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "data",
			DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-pvc"}}}})
	})
	// As the control plane leaves it before it makes the pod.
	vmi.Status.VolumeStatus = []v1alpha1.VolumeStatus{{Name: "data", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{
		ClaimName: "data-pvc", Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if err := n.c.Status().Update(ctx, vmi); err != nil {
		t.Fatalf("VMI volumeStatus: %v", err)
	}

	cmd := exec.Command(filepath.Join(n.bin, "kubevisor-launcher"), "--dir", layout.LauncherDir(n.hostDir, vmi.UID),
		"--vmi", vmi.Namespace+"/"+vmi.Name, "--grace-period", "5s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Stderr = os.Stderr
	if err := os.MkdirAll(layout.VMIDir(n.hostDir, vmi.UID), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// /var/run is a symlink to /run on Debian: an absolute symlink under /proc/<pid>/root would
	// resolve in the test's root, so the test names the claim by its resolved path.
	run, err := filepath.EvalSymlinks("/var/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(layout.ClaimsDir, "/var/run/") {
		t.Fatalf("layout.ClaimsDir %s is not under /var/run", layout.ClaimsDir)
	}
	inMountNS(t, pid, func() error {
		if err := unix.Mount("tmpfs", run, "tmpfs", 0, "size=128m"); err != nil {
			return err
		}
		return os.MkdirAll(layout.ClaimDir("data"), 0o755)
	})
	inPod := fmt.Sprintf("/proc/%d/root%s/disk.img", pid, filepath.Join(run, strings.TrimPrefix(layout.ClaimDir("data"), "/var/run/")))
	pod := n.runningPod(vmi)
	n.waitVMI("pvc", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })

	mount := layout.ClaimMount(n.hostDir, vmi.UID, "data")
	if got := mountsUnder(t, n.hostDir); len(got) != 1 || got[0] != mount {
		t.Errorf("mounts under the host state directory %v, want just %s", got, mount)
	}
	fi, err := os.Stat(inPod)
	if err != nil {
		t.Fatalf("the claim in the launcher's namespace has no disk.img: %v", err)
	}
	if fi.Size() != 60<<20 {
		t.Errorf("disk.img is %d bytes, want 60 MiB", fi.Size())
	}

	n.stopLeavingNoMounts(ctx, pod, "pvc", vmi.UID)
	if _, err := os.Lstat(filepath.Dir(mount)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the claims directory is left after the VMI stopped (%v)", err)
	}
	if _, err := os.Stat(inPod); err != nil {
		t.Errorf("the claim lost its disk.img: %v", err)
	}
}
