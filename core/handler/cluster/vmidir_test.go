package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// mountsAt counts the mounts on target in this process's mount namespace.
func mountsAt(t *testing.T, target string) int {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 4 && unescapeMountinfo(f[4]) == target {
			n++
		}
	}
	return n
}

// TestBindDir: the kubelet's emptyDir is bound onto the per-VMI directory once (a second call,
// as after a restart, adds no mount), a file written on either side is the other's, the unbind
// leaves no mount and may run again, and a missing source is an error naming it.
func TestBindDir(t *testing.T) {
	testenv.Root(t, "bind mounts")
	root := t.TempDir()
	src := layout.KubeletEmptyDir(filepath.Join(root, "kubelet"), "pod-uid", layout.VMIDirVolume)
	if err := os.MkdirAll(src, 0o777); err != nil {
		t.Fatal(err)
	}
	target := layout.VMIDir(filepath.Join(root, "run"), "vmi-uid")
	t.Cleanup(func() { _ = unbindDir(target) })
	for i := 0; i < 2; i++ {
		if err := bindDir(src, target); err != nil {
			t.Fatal(err)
		}
	}
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts on %s after two binds, want 1", n, target)
	}
	if err := os.WriteFile(filepath.Join(target, "console.log"), []byte("node"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(src, "console.log")); err != nil || string(b) != "node" {
		t.Errorf("the pod's side reads %q, %v; want what the node wrote", b, err)
	}
	for i := 0; i < 2; i++ {
		if err := unbindDir(target); err != nil {
			t.Fatal(err)
		}
	}
	if n := mountsAt(t, target); n != 0 {
		t.Errorf("%d mounts on %s after the unbind", n, target)
	}
	if _, err := os.Stat(filepath.Join(target, "console.log")); !os.IsNotExist(err) {
		t.Errorf("the node still sees the pod's file after the unbind: %v", err)
	}
	missing := layout.KubeletEmptyDir(filepath.Join(root, "kubelet"), "gone", layout.VMIDirVolume)
	if err := bindDir(missing, target); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("bind of a missing directory = %v, want an error naming it", err)
	}
}

// TestPodOwner: the compute container's user and group, else the pod's; none for root.
func TestPodOwner(t *testing.T) {
	pod := func(podUID, podGID, compUID *int64) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: podUID, RunAsGroup: podGID},
			Containers:      []corev1.Container{{Name: layout.ComputeContainer, SecurityContext: &corev1.SecurityContext{RunAsUser: compUID}}},
		}}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want *handler.FileOwner
	}{
		{"unprivileged pod", pod(ptr.To[int64](107), ptr.To[int64](107), nil), &handler.FileOwner{UID: 107, GID: 107}},
		{"compute's own user", pod(ptr.To[int64](107), ptr.To[int64](107), ptr.To[int64](1000)), &handler.FileOwner{UID: 1000, GID: 107}},
		{"root pod", pod(nil, nil, nil), nil},
		{"root by number", pod(ptr.To[int64](0), nil, nil), nil},
	} {
		got := podOwner(tc.pod)
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: owner %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if emptyDirVMIDir(&corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: layout.VMIDirVolume,
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/kubevisor/vmi/x"}}}}}}) {
		t.Error("a hostPath per-VMI directory (an earlier release's pod) taken for an emptyDir")
	}
}

// TestUnmountPropagatedCopies: a mount made in the per-VMI directory, which is bound from the
// kubelet's shared pods directory, is mounted on the same file there too; after unmountAll
// neither is, and the mount point can be removed. (Here the kernel takes the copy away with the
// original; in the handler's mount namespace on a node it did not, and the removal failed with
// EBUSY: that case is the e2e's, a containerDisk VMI deleted.)
func TestUnmountPropagatedCopies(t *testing.T) {
	testenv.Root(t, "mounts")
	root := t.TempDir()
	pods := filepath.Join(root, "pods")
	if err := os.MkdirAll(pods, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("pods", pods, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pods, unix.MNT_DETACH) })
	if err := unix.Mount("", pods, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(pods, "uid", "vmi-dir")
	if err := os.MkdirAll(filepath.Join(src, "containerdisks"), 0o755); err != nil {
		t.Fatal(err)
	}
	vmiDir := filepath.Join(root, "run", "vmi", "uid")
	if err := bindDir(src, vmiDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unbindDir(vmiDir) })
	img := filepath.Join(root, "disk.img")
	if err := os.WriteFile(img, []byte("disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(vmiDir, "containerdisks", "root.img")
	if err := os.WriteFile(target, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(img, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	copyAt := filepath.Join(src, "containerdisks", "root.img")
	if n := mountsAt(t, copyAt); n != 1 {
		t.Fatalf("%d mounts on %s, want the propagated copy", n, copyAt)
	}
	if err := unmountAll(target); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, target) + mountsAt(t, copyAt); n != 0 {
		t.Errorf("%d mounts left on %s and %s", n, target, copyAt)
	}
	if err := os.Remove(target); err != nil {
		t.Errorf("remove the mount point: %v", err)
	}
}
