// Package hostdir is the layout of the per-VMI directories on a node, shared by the launcher
// pod, which mounts them (hostPath), and the node handler, which finds each launcher's socket
// there.
package hostdir

import (
	"path"

	"k8s.io/apimachinery/pkg/types"
)

// Default is the node directory that holds the per-VMI directories. It is under /run: what they
// hold (sockets, prepared disks of running VMs) does not outlive a reboot.
const Default = "/var/run/kubevisor"

// VMI is the directory of one VMI on the node (<root>/vmi/<uid>), the launcher pod's hostPath
// volume; root "" means Default. The kubelet creates it 0755.
func VMI(root string, uid types.UID) string {
	if root == "" {
		root = Default
	}
	return path.Join(root, "vmi", string(uid))
}

// Launcher is the directory kubevisor-launcher serves its sockets in (--dir): a subdirectory of
// VMI that the launcher creates 0700 itself, since it refuses a directory others can reach and
// the kubelet makes hostPath directories 0755.
func Launcher(root string, uid types.UID) string {
	return path.Join(VMI(root, uid), "launcher")
}
