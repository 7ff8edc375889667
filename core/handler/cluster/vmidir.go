package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/layout"
)

// DefaultKubeletRoot is the kubelet's default root directory.
const DefaultKubeletRoot = "/var/lib/kubelet"

// The per-VMI directory is an emptyDir of the launcher pod (layout.VMIDirVolume), which Pod
// Security's baseline and restricted levels admit where they refuse a hostPath. The pod's
// containers mount it at layout.VMIDir; the agent binds the kubelet's directory of it
// (layout.KubeletEmptyDir) onto the same path on the node before it dials the launcher, so
// that the node's handler and drivers and the pod see one directory at one path, as they did
// when it was a hostPath. The kubelet removes the directory with the pod; the agent removes
// its bind when it releases the VMI's mounts (releaseMounts). A pod made by an earlier
// release, whose directory is a hostPath of the node, needs no bind.
//
// The handler's later mounts in the directory (containerDisk images, claims) reach the compute
// container by propagation: the bind is made from the agent's view of the kubelet's pods
// directory, which it has with Bidirectional propagation, so it is a peer of the node's mount
// that holds the kubelet's root, from which the container's HostToContainer mount receives.
// The kubelet's root must be on a shared mount (systemd makes / one; hack/cluster/up.sh makes
// the kubelet's root one on a machine without systemd).

// bindVMIDir binds the launcher pod's per-VMI directory onto layout.VMIDir, once, and says
// who the pod's processes run as (nil for root). A pod whose directory is a hostPath (made by
// an earlier release) needs no bind; with no pod there is nothing to bind.
func (a *Agent) bindVMIDir(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*handler.FileOwner, error) {
	pod, err := a.vmiDirPod(ctx, vmi)
	if err != nil {
		return nil, err
	}
	if pod == nil {
		// None in the cache (yet, or any more): the dial of the launcher says what is wrong.
		return nil, nil
	}
	owner := podOwner(pod)
	if !emptyDirVMIDir(pod) {
		return owner, nil
	}
	src := layout.KubeletEmptyDir(a.cfg.KubeletRoot, pod.UID, layout.VMIDirVolume)
	if err := bindDir(src, layout.VMIDir(a.cfg.HostStateDir, vmi.UID)); err != nil {
		return nil, fmt.Errorf("launcher pod %s: %w", pod.Name, err)
	}
	return owner, nil
}

// bindDir binds directory src onto target (made when missing), unless it is there already (by
// this agent before a restart, say).
func bindDir(src, target string) error {
	same, err := samePath(src, target)
	if err != nil {
		return fmt.Errorf("its per-VMI directory %s: %w", src, err)
	}
	if same {
		return nil
	}
	if err := os.MkdirAll(target, 0o700); err != nil {
		return fmt.Errorf("per-VMI directory: %w", err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind its per-VMI directory %s onto %s: %w", src, target, err)
	}
	return nil
}

// vmiDirPod is the launcher pod whose per-VMI directory the VMI's is on this node: its
// launcher pod (launcherPod), else, for a live migration's target, the target pod the VMI's
// migration state names, else the newest of its pods here that has not ended.
func (a *Agent) vmiDirPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	pod, err := a.launcherPod(ctx, vmi)
	if err != nil || pod != nil {
		return pod, err
	}
	pods, err := a.nodePods(ctx, vmi)
	if err != nil {
		return nil, err
	}
	var found *corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if ms := vmi.Status.MigrationState; ms != nil && ms.TargetNode == a.cfg.NodeName && ms.TargetPod == p.Name {
			return p, nil
		}
		if found == nil || p.CreationTimestamp.After(found.CreationTimestamp.Time) {
			found = p
		}
	}
	return found, nil
}

// unbindVMIDir removes the bind of VMI uid's directory (none: nothing to do), and the empty
// directory it was on.
func (a *Agent) unbindVMIDir(uid types.UID) error {
	return unbindDir(layout.VMIDir(a.cfg.HostStateDir, uid))
}

// unbindDir removes every mount on target (none: nothing to do).
func unbindDir(target string) error {
	for {
		err := unix.Unmount(target, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not a mount (any more)
		}
		if err != nil {
			return fmt.Errorf("unmount the per-VMI directory %s: %w", target, err)
		}
	}
	return nil
}

// emptyDirVMIDir says whether pod's per-VMI directory is an emptyDir.
func emptyDirVMIDir(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == layout.VMIDirVolume {
			return v.EmptyDir != nil
		}
	}
	return false
}

// podOwner is the user and group pod's compute container runs as, nil for root.
func podOwner(pod *corev1.Pod) *handler.FileOwner {
	var uid, gid *int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		uid, gid = sc.RunAsUser, sc.RunAsGroup
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == layout.ComputeContainer && c.SecurityContext != nil {
			if c.SecurityContext.RunAsUser != nil {
				uid = c.SecurityContext.RunAsUser
			}
			if c.SecurityContext.RunAsGroup != nil {
				gid = c.SecurityContext.RunAsGroup
			}
		}
	}
	if uid == nil || *uid == 0 {
		return nil
	}
	o := &handler.FileOwner{UID: int(*uid)}
	if gid != nil {
		o.GID = int(*gid)
	}
	return o
}

// samePath says whether a and b are one directory (b bound from a); a missing b is not.
func samePath(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
