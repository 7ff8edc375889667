// Package layout is what the control plane and the node agree on about a VMI's launcher pod:
// the per-VMI directory on the node, the files and sockets in it, the names of the pod's
// containers, and the grace period of a VMI that sets none.
//
// controlplane/launcherpod builds the pod from these names; the node handler
// (core/handler/cluster), kubevisor-launcher and the pod's helper commands find each other
// through them. docs/architecture.md ("The per-VMI directory") says who makes and reads each
// entry. The package imports only the standard library and k8s.io/apimachinery/pkg/types (which
// imports nothing), so that the static helper binaries of the launcher image can use it.
//
// Every path function takes the node directory that holds the per-VMI directories
// (hostStateDir, the --host-state-dir of kubevisor-controller and kubevisor-handler); "" means
// DefaultHostStateDir.
package layout

import (
	"path"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultHostStateDir is the node directory that holds the per-VMI directories. It is under
// /run: what they hold (sockets, prepared disks of running VMs) does not outlive a reboot.
const DefaultHostStateDir = "/var/run/kubevisor"

// Names in the per-VMI directory (VMIDir).
const (
	// LauncherDirName is the subdirectory kubevisor-launcher serves its sockets in (LauncherDir).
	LauncherDirName = "launcher"
	// ConsoleLogName is the file the node handler writes the guest's serial console to, and the
	// guest-console-log container follows (ConsoleLog).
	ConsoleLogName = "console.log"
	// ContainerDisksDirName is the subdirectory of the containerDisk volumes' sockets and disks
	// (ContainerDiskDir).
	ContainerDisksDirName = "containerdisks"
	// GuestProbeDirName is the subdirectory the node handler serves the guest probe socket in
	// (GuestProbeDir).
	GuestProbeDirName = "guest-probe"
	// GuestProbeSocketName is the guest probe socket in GuestProbeDir (GuestProbeSocket).
	GuestProbeSocketName = "probe.sock"
)

// Names of the launcher pod's containers and commands that both sides use.
const (
	// ComputeContainer is the launcher pod's container that runs kubevisor-launcher and, under
	// it, the VM process: the node handler watches it to see the launcher exit.
	ComputeContainer = "compute"
	// ConsoleLogContainer is the launcher pod's container that prints the guest's serial
	// console (`kubectl logs <pod> -c guest-console-log`), as KubeVirt's of the same name.
	ConsoleLogContainer = "guest-console-log"
	// ContainerDiskCommand is the static binary of the launcher image that serves a
	// containerDisk volume's socket in that volume's container (cmd/kubevisor-containerdisk).
	ContainerDiskCommand = "kubevisor-containerdisk"
	// GuestProbeCommand is the static binary of the launcher image that the compute container's
	// exec probe runs for a VMI's exec or guestAgentPing probe: it asks the node handler, through
	// GuestProbeSocket, to ping the guest agent or run the command in the guest
	// (cmd/kubevisor-probe).
	GuestProbeCommand = "kubevisor-probe"
)

// The user and group an unprivileged launcher pod runs as (every container of it): the VM
// process with them. 107 is KubeVirt's ("qemu"), so that disk images and claims made for
// KubeVirt's non-root launchers (owned by 107, or fsGroup 107) serve here unchanged. The node
// handler makes the files it makes for such a VMI in its per-VMI directory theirs.
const (
	LauncherUID = 107
	LauncherGID = 107
)

// VMIDirVolume is the launcher pod's volume of its per-VMI directory: an emptyDir, which the
// pod's containers mount at VMIDir and the node handler binds from the kubelet's directory of
// it (KubeletEmptyDir) onto VMIDir on the node, so that both see one directory at one path.
const VMIDirVolume = "kubevisor-vmi-dir"

// KubeletEmptyDir is where the kubelet whose root directory is kubeletRoot keeps the emptyDir
// volume named volume of the pod with UID podUID.
func KubeletEmptyDir(kubeletRoot string, podUID types.UID, volume string) string {
	return path.Join(kubeletRoot, "pods", string(podUID), "volumes", "kubernetes.io~empty-dir", volume)
}

// DefaultGracePeriod is the graceful shutdown time of a VMI that sets no
// terminationGracePeriodSeconds (a pod's default, and KubeVirt's), and kubevisor-launcher's
// when it is given no --grace-period. VirtualMachineInstanceSpec.GracePeriod in
// core/api/v1alpha1 applies it; it is defined here so that kubevisor-launcher, which links no
// Kubernetes API types, has the same default.
const DefaultGracePeriod = 30 * time.Second

func root(hostStateDir string) string {
	if hostStateDir == "" {
		return DefaultHostStateDir
	}
	return hostStateDir
}

// VMIsDir is the directory of the per-VMI directories on the node (<hostStateDir>/vmi).
func VMIsDir(hostStateDir string) string { return path.Join(root(hostStateDir), "vmi") }

// VMIDir is the directory of one VMI on the node (<hostStateDir>/vmi/<uid>): the launcher pod's
// emptyDir VMIDirVolume, mounted at the same path in the pod and bound there on the node by the
// node handler, so that a path written there means the same file on the node and in the pod.
func VMIDir(hostStateDir string, uid types.UID) string {
	return path.Join(VMIsDir(hostStateDir), string(uid))
}

// LauncherDir is the directory kubevisor-launcher serves its sockets in (--dir): a subdirectory
// of VMIDir that the launcher creates 0700 itself, since it refuses a directory others can reach
// and the kubelet makes emptyDir directories 0777.
func LauncherDir(hostStateDir string, uid types.UID) string {
	return path.Join(VMIDir(hostStateDir, uid), LauncherDirName)
}

// ConsoleLog is the file of the guest's serial console in VMIDir.
func ConsoleLog(hostStateDir string, uid types.UID) string {
	return path.Join(VMIDir(hostStateDir, uid), ConsoleLogName)
}

// GuestProbeDir is the directory the node handler serves GuestProbeSocket in, for the VMIs with
// an exec or guestAgentPing probe: it makes it 0700 and gives it, and the socket, to the
// launcher's user (the owner of LauncherDir), so that only the launcher pod's compute container
// and root on the node reach the socket.
func GuestProbeDir(hostStateDir string, uid types.UID) string {
	return path.Join(VMIDir(hostStateDir, uid), GuestProbeDirName)
}

// GuestProbeSocket is the socket of the node handler that kubevisor-probe (GuestProbeCommand)
// asks, in the compute container, to probe the VMI's guest through its guest agent.
func GuestProbeSocket(hostStateDir string, uid types.UID) string {
	return path.Join(GuestProbeDir(hostStateDir, uid), GuestProbeSocketName)
}

// ContainerDiskDir is the directory of the containerDisk volumes' sockets and disks in VMIDir:
// the containerDisk containers' own hostPath volume, at the same path.
func ContainerDiskDir(hostStateDir string, uid types.UID) string {
	return path.Join(VMIDir(hostStateDir, uid), ContainerDisksDirName)
}

// ContainerDiskSocket is the socket the container of a containerDisk volume serves.
func ContainerDiskSocket(hostStateDir string, uid types.UID, volume string) string {
	return path.Join(ContainerDiskDir(hostStateDir, uid), volume+".sock")
}

// ContainerDiskImage is where the node handler mounts the disk of a containerDisk volume,
// read-only, for the VM process in the compute container to open (as the base of its
// copy-on-write overlay).
func ContainerDiskImage(hostStateDir string, uid types.UID, volume string) string {
	return path.Join(ContainerDiskDir(hostStateDir, uid), volume+".img")
}

// SecretsDir is where the launcher pod's compute container has the Secrets its VMI names
// (cloud-init secretRef and networkDataSecretRef, accessCredentials), one read-only Secret
// volume per Secret at SecretDir. The kubelet fetches them with the node's credentials, which
// reach only the Secrets of pods bound to the node; the node handler reads them from the
// launcher process's root, so it needs no right on Secrets of its own.
const SecretsDir = "/var/run/kubevisor-private/secrets"

// SecretDir is where the compute container has the Secret name (a DNS subdomain, so one path
// element): a file per key.
func SecretDir(name string) string { return path.Join(SecretsDir, name) }

// HugepagesDir is where the launcher pod's compute container has the hugetlbfs of its VMI's
// huge pages (memory.hugepages), an emptyDir of medium HugePages-<pageSize>: the VM process
// makes its guest memory's file there. It is a path in the container only; nothing on the node
// side opens it.
const HugepagesDir = "/var/run/kubevisor-private/hugepages"

// ClaimsDir is where the launcher pod's compute container has the claims of its VMI's
// persistentVolumeClaim and ephemeral volumes, one directory per volume at ClaimDir (a
// file-system claim: its disk image is disk.img there). The node handler mounts each, from
// the launcher process's root, at ClaimMount, where the storage driver and the VM process
// both find it.
const ClaimsDir = "/var/run/kubevisor-private/vmi-disks"

// ClaimDir is where the compute container has the claim of the volume named volume.
func ClaimDir(volume string) string { return path.Join(ClaimsDir, volume) }

// VMStateDir is where the launcher pod's compute container has its VM's persistent state claim
// (KubeVirt's backend storage): the TPM's state of a persistent TPM and the EFI variable
// store of persistent EFI, which outlive the VMI. The node handler mounts it at StateMount.
const VMStateDir = "/var/run/kubevisor-private/vm-state"

// ClaimsDirName is the subdirectory of VMIDir where the node handler mounts the VMI's claims
// (ClaimMount) and its persistent state (StateMount).
const ClaimsDirName = "claims"

// ClaimMount is where the node handler mounts the claim of the volume named volume, in VMIDir,
// which the compute container sees at the same path.
func ClaimMount(hostStateDir string, uid types.UID, volume string) string {
	return path.Join(VMIDir(hostStateDir, uid), ClaimsDirName, volume)
}

// StateMount is where the node handler mounts the VMI's persistent state claim (VMStateDir),
// in VMIDir. Its name cannot be a volume's (volume names are DNS labels, which have no dot).
func StateMount(hostStateDir string, uid types.UID) string {
	return path.Join(VMIDir(hostStateDir, uid), ClaimsDirName, ".vm-state")
}
