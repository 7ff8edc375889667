// Package launcherpod builds the launcher pod that runs one VirtualMachineInstance on a node.
//
// Build is a pure function of the VMI, its HypervisorClass and the controller's Config: the same
// inputs give the same pod, so the VMI controller can create it idempotently and tests can read
// it field by field.
//
// # The per-VMI directory
//
// Each VMI has a directory on its node, <HostStateDir>/vmi/<VMI UID> (layout.VMIDir), shared by
// the node handler (which runs the drivers on the host) and the launcher pod. It is the pod's
// emptyDir layout.VMIDirVolume, mounted at that path in the pod's containers; the node handler
// binds the kubelet's directory of it onto the same path on the node before it dials the
// launcher (core/handler/cluster, vmidir.go), so that a path the handler or a storage driver
// writes there (a prepared disk, a cloud-init ISO) means the same file inside the pod. An
// emptyDir, unlike the hostPath of earlier releases, is a volume Pod Security's baseline and
// restricted levels admit. Files appear in the pod as they are written. Mounts the handler
// makes in it after the pod started appear only with HostToContainer propagation, which the
// runtime refuses unless the kubelet's root is on a shared or slave mount: the launcher
// container has it only when the VMI has containerDisk volumes, whose disks the handler mounts
// there (see Volumes), or claims, which the handler mounts there from the launcher container's
// own mounts (layout.ClaimMount, layout.StateMount).
//
// kubevisor-launcher serves its sockets in layout.LauncherDir, a subdirectory of it, not in the
// directory itself: the kubelet makes an emptyDir 0777, and the launcher refuses to serve in a
// directory that group or others can reach (whoever reaches its socket runs programs in the
// sandbox). The launcher creates that directory 0700 itself; the handler dials launcher.sock in
// it. docs/architecture.md lists every file of the directory.
//
// # Volumes
//
//	| VMI volume             | launcher pod                                                      |
//	|------------------------|-------------------------------------------------------------------|
//	| persistentVolumeClaim  | the claim, mounted at DiskMountDir/<volume> (filesystem mode)     |
//	| ephemeral              | its backing claim, read-only, at DiskMountDir/<volume>            |
//	| hostDisk               | hostPath of the image's directory, at the same path               |
//	| containerDisk          | a container running the volume's image (ContainerDiskContainer)   |
//	| emptyDisk, cloudInit*  | nothing: the storage driver creates them in the per-VMI directory |
//	| a Secret it names      | the Secret, read-only, at layout.SecretDir(<secret>) (see below)  |
//	| memory.hugepages       | an emptyDir of medium HugePages-<pageSize> at layout.HugepagesDir |
//	| tpm/efi persistent     | the VM's persistent state claim at layout.VMStateDir (StateClaim) |
//
// Each Secret the VMI names (VirtualMachineInstanceSpec.SecretNames: cloud-init secretRef and
// networkDataSecretRef, accessCredentials) is a Secret volume of the launcher container. The
// kubelet fetches it with the node's credentials, which the node authorizer limits to the
// Secrets of pods bound to that node; the node handler reads the files from the launcher
// process's root to resolve the cloud-init data. So neither the handler nor the launcher needs
// a right on Secrets, and a VMI reaches only Secrets of its own namespace, as a pod does.
//
// Claims are attached by the kubelet so that the scheduler, the attach/detach controller and CSI
// see them as used by the pod.
//
// A containerDisk is pulled by the kubelet, as KubeVirt's are: the pod has a container per
// containerDisk volume whose image is the volume's (so the image is pulled, cached and
// garbage-collected like any other, with the pod's pull secrets) and whose command is
// kubevisor-containerdisk, a static binary of the launcher image (the disk image holds nothing
// but /disk/), which the init container ContainerDiskInstallContainer copies into an emptyDir
// that these containers mount read-only, as KubeVirt does. (Earlier releases ran it from a
// hostPath of the node, which no namespace enforcing baseline admits.) It serves a socket in
// layout.ContainerDiskDir, in the per-VMI directory, until the pod ends; the node handler finds
// the container's process through it, and bind-mounts the image's disk read-only into that
// directory, where the launcher container sees it (HostToContainer) and the storage driver
// makes the VM's overlay over it.
//
// # Security
//
// The launcher container is not privileged, shares no host namespace, drops every capability and
// cannot gain privileges: it only starts the VM process the driver asks for. Its seccomp profile
// is the runtime's default plus userfaultfd, which QEMU needs for post-copy migration (package
// core/seccomp; Config.ComputeSeccomp); the other containers have the runtime's default. Host
// devices reach it only through the device plugin resources the class lists
// (HypervisorClass.DeviceResources); the runtime makes them the container's user's (containerd's
// device_ownership_from_security_context, which nodes must enable, as KubeVirt's).
//
// The pod of a class without launcher capabilities (qmp's) is unprivileged: every container runs
// as layout.LauncherUID and LauncherGID (107, KubeVirt's qemu), with runAsNonRoot, which with the
// rest is all Pod Security's restricted level asks. The handler makes the files it makes for such
// a VMI the launcher's, and its taps (the network contract's sandbox_user). A class whose VM
// manager needs capabilities (libvirt's daemon: SETUID, SETGID) has its pods run as root with
// those capabilities only, since a process that is not root does not get them: baseline admits
// such a pod, restricted does not, and the webhook says so (controlplane/webhook).
//
// The pod's securityContext.seLinuxOptions.level is the VMI's status.selinuxLevel, an SELinux
// MCS level no other VMI's pods have (the VMI controller allocates it before it builds the pod:
// package core/mcs), so that where SELinux is enabled every container of the pod, the VM
// process with them, runs at it, and the node labels the VMI's files with it. It is set whatever
// the node (the pod is built before it is scheduled); a node with SELinux disabled ignores it.
package launcherpod

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/mcs"
	"github.com/kubevisor/kubevisor/core/seccomp"
)

// Defaults of Config, and the fixed names of the pod that only the control plane uses (the
// names the node uses too are in core/layout).
const (
	// DefaultGracePeriodMarginSeconds is added to the VMI's grace period to make the pod's, so that
	// the launcher's own deadline (and its kill of the VM process) comes before the kubelet's
	// SIGKILL; KubeVirt uses the same margin.
	DefaultGracePeriodMarginSeconds = 15

	// LauncherCommand is the launcher binary in the launcher image.
	LauncherCommand = "kubevisor-launcher"
	// ConsoleLogCommand is the launcher image's static console follower (cmd/kubevisor-console-log):
	// a stdlib-only binary, a fifth of the launcher's resident memory.
	ConsoleLogCommand = "kubevisor-console-log"
	// DiskMountDir is where claims are mounted in the launcher container, one directory per volume.
	DiskMountDir = layout.ClaimsDir
	// VMIDirVolumeName is the name of the pod volume of the per-VMI directory.
	VMIDirVolumeName = layout.VMIDirVolume
	// HugepagesVolumeName is the name of the pod volume of the guest memory's huge pages.
	HugepagesVolumeName = "kubevisor-hugepages"
	// SecretVolumePrefix starts the names of the pod's Secret volumes (SecretVolumeName).
	SecretVolumePrefix = "secret-"
	// NamePrefix starts the name of every launcher pod.
	NamePrefix = "kubevisor-launcher-"

	// ContainerDiskBinVolumeName is an emptyDir into which the init container
	// ContainerDiskInstallContainer copies kubevisor-containerdisk from the launcher image,
	// mounted read-only at ContainerDiskBinDir in the containerDisk containers.
	ContainerDiskBinVolumeName = "kubevisor-containerdisk-bin"
	// ContainerDiskBinDir is where the containerDisk containers find kubevisor-containerdisk.
	ContainerDiskBinDir = "/kubevisor-containerdisk"
	// ContainerDiskInstallContainer is the init container that copies kubevisor-containerdisk
	// into ContainerDiskBinVolumeName.
	ContainerDiskInstallContainer = "install-containerdisk"
	// ContainerDiskContainerPrefix starts the name of a containerDisk volume's container.
	ContainerDiskContainerPrefix = "volume-"
)

// Resources of the pod's helper containers — the containerDisk containers and guest-console-log
// — which only sleep or follow a file. They request HelperCPU and HelperMemory, and are limited
// to HelperMemory. They get a CPU limit (HelperGuaranteedCPU, and requests equal to limits) only
// when the compute container's requests equal its limits, so that the pod stays in the
// Guaranteed QoS class with it; otherwise a CPU limit buys nothing (the pod is Burstable) and
// a small one throttles the runtime's own start-up of the container, which runs in the
// container's cgroup: 10m made each container start take about 0.7 s more here.
var (
	HelperCPU           = resource.MustParse("10m")
	HelperMemory        = resource.MustParse("16Mi")
	HelperGuaranteedCPU = resource.MustParse("100m")
)

// helperResources are the helper containers' resources beside a compute container with
// compute's.
func helperResources(compute corev1.ResourceRequirements) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: HelperCPU.DeepCopy(), corev1.ResourceMemory: HelperMemory.DeepCopy()},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: HelperMemory.DeepCopy()},
	}
	if guaranteed(compute) {
		r.Requests[corev1.ResourceCPU] = HelperGuaranteedCPU.DeepCopy()
		r.Limits[corev1.ResourceCPU] = HelperGuaranteedCPU.DeepCopy()
	}
	return r
}

// guaranteed says whether a container's resources put it in the Guaranteed QoS class: a CPU
// and a memory limit, and every request equal to its limit.
func guaranteed(r corev1.ResourceRequirements) bool {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		lim, ok := r.Limits[name]
		if !ok || lim.IsZero() {
			return false
		}
		if req, ok := r.Requests[name]; ok && req.Cmp(lim) != 0 {
			return false
		}
	}
	return true
}

// DefaultLauncherMemoryOverhead is the memory the launcher and the hypervisor process need beyond
// the guest's memory, unless Config says otherwise.
var DefaultLauncherMemoryOverhead = resource.MustParse("180Mi")

// DefaultCPURequestPerVCPU is the CPU requested per vCPU of a VMI that requests no CPU (one tenth
// of a core: KubeVirt's default CPU allocation ratio of 10).
var DefaultCPURequestPerVCPU = resource.MustParse("100m")

// Config is the part of the VMI controller's configuration that shapes launcher pods.
type Config struct {
	// LauncherImage is the image that holds kubevisor-launcher and the hypervisor runtime. Required.
	LauncherImage string
	// ImagePullPolicy of the launcher image. Default: IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// HostStateDir is the node directory that holds the per-VMI directories. Default:
	// layout.DefaultHostStateDir.
	HostStateDir string
	// LauncherMemoryOverhead is added to the guest memory in the pod's memory request and limit.
	// Zero means DefaultLauncherMemoryOverhead.
	LauncherMemoryOverhead resource.Quantity
	// CPURequestPerVCPU is the CPU requested per vCPU when the VMI requests no CPU.
	// Zero means DefaultCPURequestPerVCPU.
	CPURequestPerVCPU resource.Quantity
	// GracePeriodMarginSeconds is added to the VMI's grace period to make the pod's.
	// Nil means DefaultGracePeriodMarginSeconds.
	GracePeriodMarginSeconds *int64
	// StateStorageClass is the storage class of the VMs' persistent state claims (StateClaim);
	// empty means the cluster's default class. KubeVirt's vmStateStorageClass.
	StateStorageClass string
	// ComputeSeccomp is the seccomp profile type of the compute container: Localhost (the
	// default) gives it seccomp.LauncherProfileName, the runtime's default profile plus
	// userfaultfd (post-copy migration), which the handler DaemonSet installs on every node;
	// RuntimeDefault gives it the runtime's own, for clusters that forbid Localhost profiles
	// (post-copy migrations then fail on the target). The pod's other containers run with
	// RuntimeDefault either way.
	ComputeSeccomp corev1.SeccompProfileType
}

func (c Config) withDefaults() (Config, error) {
	if c.LauncherImage == "" {
		return c, errors.New("no launcher image configured")
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if c.HostStateDir == "" {
		c.HostStateDir = layout.DefaultHostStateDir
	}
	if !path.IsAbs(c.HostStateDir) {
		return c, fmt.Errorf("host state directory %q is not an absolute path", c.HostStateDir)
	}
	if c.LauncherMemoryOverhead.IsZero() {
		c.LauncherMemoryOverhead = DefaultLauncherMemoryOverhead
	}
	if c.CPURequestPerVCPU.IsZero() {
		c.CPURequestPerVCPU = DefaultCPURequestPerVCPU
	}
	if c.GracePeriodMarginSeconds == nil {
		c.GracePeriodMarginSeconds = ptr.To[int64](DefaultGracePeriodMarginSeconds)
	}
	if *c.GracePeriodMarginSeconds < 0 {
		return c, errors.New("negative grace period margin")
	}
	switch c.ComputeSeccomp {
	case "":
		c.ComputeSeccomp = corev1.SeccompProfileTypeLocalhost
	case corev1.SeccompProfileTypeLocalhost, corev1.SeccompProfileTypeRuntimeDefault:
	default:
		return c, fmt.Errorf("compute container seccomp profile %q is neither Localhost nor RuntimeDefault", c.ComputeSeccomp)
	}
	return c, nil
}

// ContainerDiskContainer is the name of the container of a containerDisk volume: "volume-"
// and the volume's name, shortened with a hash of it when that is too long for a container
// name.
func ContainerDiskContainer(volume string) string {
	name := ContainerDiskContainerPrefix + volume
	if len(name) <= validation.DNS1123LabelMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(volume))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	return strings.TrimRight(name[:validation.DNS1123LabelMaxLength-len(suffix)], "-") + suffix
}

// Name is the name of the launcher pod of a VMI: fixed by the VMI's UID, so that creating it
// twice (from a stale cache) answers AlreadyExists instead of making a second pod, and a new VMI
// of the same name does not collide with the old one's terminating pod. It fits in 63
// characters, since a pod's hostname may be derived from its name.
func Name(vmiName string, uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := "-" + hex.EncodeToString(sum[:])[:5]
	base := NamePrefix + vmiName
	if limit := validation.DNS1123LabelMaxLength - len(suffix); len(base) > limit {
		base = strings.TrimRight(base[:limit], "-.")
	}
	return base + suffix
}

// Build returns the launcher pod of vmi for class. The error says which input is unusable: no
// memory, a node selector on which the VMI and the class disagree, a device resource outside
// devices.kubevisor.io/, a pod volume name clash.
func Build(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass, cfg Config) (*corev1.Pod, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if vmi.UID == "" {
		return nil, errors.New("VMI has no UID")
	}
	if class == nil {
		return nil, errors.New("no HypervisorClass")
	}
	if class.Driver == "" {
		return nil, fmt.Errorf("HypervisorClass %s names no driver", class.Name)
	}
	for _, n := range []struct{ what, value string }{{"VMI name", vmi.Name}, {"HypervisorClass name", class.Name}, {"HypervisorClass driver", class.Driver}} {
		if errs := validation.IsValidLabelValue(n.value); len(errs) > 0 {
			return nil, fmt.Errorf("%s %q cannot be a label value of its launcher pod: %s", n.what, n.value, strings.Join(errs, "; "))
		}
	}

	resources, err := buildResources(vmi, class, cfg)
	if err != nil {
		return nil, err
	}
	nodeSelector, err := mergeNodeSelector(vmi, class)
	if err != nil {
		return nil, err
	}
	volumes, mounts, err := buildVolumes(vmi, cfg)
	if err != nil {
		return nil, err
	}
	helpers := helperResources(resources)
	diskInit, diskContainers, diskVolumes, err := buildContainerDisks(vmi, class, cfg, volumes, mounts[0], helpers)
	if err != nil {
		return nil, err
	}
	volumes = append(volumes, diskVolumes...)
	if len(diskContainers) > 0 || hasClaims(vmi) {
		// The handler mounts the containerDisks' disks, the claims and the persistent state
		// there after the container started.
		mounts[0].MountPropagation = ptr.To(corev1.MountPropagationHostToContainer)
	}

	podSecurity, err := podSecurityContext(vmi, unprivileged(class))
	if err != nil {
		return nil, err
	}

	vmiGrace := vmi.Spec.GracePeriodSeconds()

	labels := map[string]string{}
	// The VMI's labels go to the pod, as KubeVirt does, so that a Service selecting VMIs by
	// label reaches their launcher pods (which hold the guest's network).
	for k, v := range vmi.Labels {
		labels[k] = v
	}
	delete(labels, v1alpha1.NodeNameLabel)
	labels[v1alpha1.CreatedByLabel] = string(vmi.UID)
	labels[v1alpha1.VirtualMachineInstanceNameLabel] = vmi.Name
	labels[v1alpha1.HypervisorClassLabel] = class.Name
	labels[v1alpha1.HypervisorDriverLabel] = class.Driver

	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name(vmi.Name, vmi.UID),
			Namespace: vmi.Namespace,
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         v1alpha1.GroupVersion.String(),
				Kind:               "VirtualMachineInstance",
				Name:               vmi.Name,
				UID:                vmi.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(vmiGrace + *cfg.GracePeriodMarginSeconds),
			// The launcher talks to nobody but the handler, through its socket.
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			Hostname:                     vmi.GuestHostname(),
			Subdomain:                    vmi.Spec.Subdomain,
			// The guest resolves names through the pod's resolv.conf (the network driver's DNS
			// forwarding), so the VMI's DNS settings are the pod's, as in KubeVirt.
			DNSPolicy:         vmi.Spec.DNSPolicy,
			DNSConfig:         vmi.Spec.DNSConfig.DeepCopy(),
			NodeSelector:      nodeSelector,
			PriorityClassName: vmi.Spec.PriorityClassName,
			SchedulerName:     vmi.Spec.SchedulerName,
			Affinity:          buildAffinity(vmi, class),
			Tolerations:       mergeTolerations(vmi, class),
			SecurityContext:   podSecurity,
			Volumes:           volumes,
			InitContainers:    diskInit,
			Containers: append([]corev1.Container{{
				Name:            layout.ComputeContainer,
				Image:           cfg.LauncherImage,
				ImagePullPolicy: cfg.ImagePullPolicy,
				Command:         []string{LauncherCommand},
				Args: []string{
					"--dir", layout.LauncherDir(cfg.HostStateDir, vmi.UID),
					"--vmi", vmi.Namespace + "/" + vmi.Name,
					"--grace-period", fmt.Sprintf("%ds", vmiGrace),
				},
				Resources:      resources,
				VolumeMounts:   mounts,
				LivenessProbe:  KubeletProbe(vmi.Spec.LivenessProbe, layout.GuestProbeSocket(cfg.HostStateDir, vmi.UID)),
				ReadinessProbe: KubeletProbe(vmi.Spec.ReadinessProbe, layout.GuestProbeSocket(cfg.HostStateDir, vmi.UID)),
				SecurityContext: &corev1.SecurityContext{
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					// All dropped, bar what the class keeps for its driver's VM manager.
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: slices.Clone(class.LauncherCapabilities)},
					SeccompProfile: computeSeccomp(cfg.ComputeSeccomp),
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}}, helperContainers(vmi, class, cfg, mounts[0], helpers, diskContainers)...),
		},
	}
	return pod, nil
}

// unprivileged says whether the class's launcher pods run as layout.LauncherUID: every class
// but those whose VM manager needs capabilities (HypervisorClass.LauncherCapabilities, which a
// process that is not root does not get from the runtime), whose pods run as root without
// other capabilities. Only an unprivileged pod passes Pod Security's restricted level.
func unprivileged(class *v1alpha1.HypervisorClass) bool { return len(class.LauncherCapabilities) == 0 }

// podSecurityContext is the pod's security context: the runtime's default seccomp profile, the
// VMI's SELinux level (status.selinuxLevel) when it has one, and for an unprivileged pod its
// user and group (layout.LauncherUID, LauncherGID, also the fsGroup, which makes the per-VMI
// directory and the claims theirs). Of the SELinux options only the level is set: the user,
// role and type are the runtime's (Pod Security's restricted profile allows no user or role,
// and only the container types), and where a node has SELinux disabled the runtime ignores the
// level.
func podSecurityContext(vmi *v1alpha1.VirtualMachineInstance, unprivileged bool) (*corev1.PodSecurityContext, error) {
	sc := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if unprivileged {
		sc.RunAsNonRoot = ptr.To(true)
		sc.RunAsUser = ptr.To[int64](layout.LauncherUID)
		sc.RunAsGroup = ptr.To[int64](layout.LauncherGID)
		sc.FSGroup = ptr.To[int64](layout.LauncherGID)
	}
	if s := vmi.Status.SELinuxLevel; s != "" {
		l, err := mcs.ParseLevel(s)
		if err != nil {
			return nil, fmt.Errorf("status.selinuxLevel: %w", err)
		}
		sc.SELinuxOptions = &corev1.SELinuxOptions{Level: l.String()}
	}
	return sc, nil
}

// computeSeccomp is the compute container's seccomp profile of type t (Config.ComputeSeccomp).
func computeSeccomp(t corev1.SeccompProfileType) *corev1.SeccompProfile {
	if t == corev1.SeccompProfileTypeLocalhost {
		return &corev1.SeccompProfile{Type: t, LocalhostProfile: ptr.To(seccomp.LauncherProfileName)}
	}
	return &corev1.SeccompProfile{Type: t}
}

// helperContainers are the pod's containers beside compute: guest-console-log when the VMI's
// serial console is logged (VirtualMachineInstanceSpec.SerialConsoleLogged), then the
// containerDisk containers.
func helperContainers(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass, cfg Config, vmiDir corev1.VolumeMount, res corev1.ResourceRequirements, disks []corev1.Container) []corev1.Container {
	if !vmi.Spec.SerialConsoleLogged() {
		return disks
	}
	return append([]corev1.Container{consoleLogContainer(vmi, class, cfg, vmiDir, res)}, disks...)
}

// consoleLogContainer follows the guest's serial console log, which the node handler writes
// into the VMI directory, so that `kubectl logs <pod> -c guest-console-log` shows the console
// (as KubeVirt's container of the same name), with kubevisor-console-log from the launcher
// image. vmiDir is the compute container's mount of the VMI directory; this container mounts it
// read-only.
func consoleLogContainer(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass, cfg Config, vmiDir corev1.VolumeMount, res corev1.ResourceRequirements) corev1.Container {
	vmiDir.ReadOnly = true
	vmiDir.MountPropagation = nil
	return corev1.Container{
		Name:                     layout.ConsoleLogContainer,
		Image:                    cfg.LauncherImage,
		ImagePullPolicy:          cfg.ImagePullPolicy,
		Command:                  []string{ConsoleLogCommand},
		Args:                     []string{"--file", layout.ConsoleLog(cfg.HostStateDir, vmi.UID)},
		Resources:                res,
		VolumeMounts:             []corev1.VolumeMount{vmiDir},
		SecurityContext:          security(unprivileged(class)),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// guestMemory is the memory the guest sees: domain.memory.guest, else the requested memory.
func guestMemory(vmi *v1alpha1.VirtualMachineInstance) (resource.Quantity, error) {
	if m := vmi.Spec.Domain.Memory; m != nil && m.Guest != nil && !m.Guest.IsZero() {
		return m.Guest.DeepCopy(), nil
	}
	if q, ok := vmi.Spec.Domain.Resources.Requests[corev1.ResourceMemory]; ok && !q.IsZero() {
		return q.DeepCopy(), nil
	}
	return resource.Quantity{}, errors.New("VMI sets no memory (spec.domain.memory.guest or spec.domain.resources.requests.memory)")
}

// buildResources computes the launcher container's requests and limits:
//
//	memory  request: requests.memory (else guest memory) + launcher overhead + class podFixed
//	        limit:   limits.memory (else the larger of guest memory and the request base) + the same
//	cpu     request: requests.cpu, else limits.cpu, else vCPUs × CPURequestPerVCPU; + podFixed
//	        limit:   limits.cpu + podFixed, only when the VMI sets one
//	devices each of class.deviceResources, 1 (requests = limits, as extended resources must be)
//
// With cpu.dedicatedCpuPlacement the container is in the Guaranteed QoS class with whole CPUs,
// which the kubelet's static CPU manager gives exclusive CPUs to:
//
//	cpu     request = limit = DomainSpec.DedicatedCPUs (the vCPUs, + 1 with isolateEmulatorThread);
//	        a podFixed cpu overhead is not added (a fraction would forfeit the exclusive CPUs)
//	memory  request = limit, the limit above
//
// (the webhook has checked that the VMI's own cpu and memory requests equal their limits).
//
// A memory limit is always set: a VM's footprint is its guest memory plus a bounded overhead,
// and an unbounded one would let a guest take memory the scheduler gave to other pods.
//
// With memory.hugepages the guest memory is not ordinary memory: it is requested and limited
// as hugepages-<pageSize> (requests = limits, as Kubernetes requires of huge pages), so the
// scheduler places the pod only on a node with that many free pages of the size, and it is
// taken out of the memory request and limit above, which keep what requests.memory and
// limits.memory exceed the guest memory by, the launcher overhead and podFixed: QEMU's own
// memory, which is not on huge pages.
func buildResources(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass, cfg Config) (corev1.ResourceRequirements, error) {
	guest, err := guestMemory(vmi)
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	vr := vmi.Spec.Domain.Resources
	req, lim := corev1.ResourceList{}, corev1.ResourceList{}

	memReq := guest.DeepCopy()
	if q, ok := vr.Requests[corev1.ResourceMemory]; ok && !q.IsZero() {
		memReq = q.DeepCopy()
	}
	memLim := guest.DeepCopy()
	if memReq.Cmp(memLim) > 0 {
		memLim = memReq.DeepCopy()
	}
	if q, ok := vr.Limits[corev1.ResourceMemory]; ok && !q.IsZero() {
		if q.Cmp(memReq) < 0 {
			return corev1.ResourceRequirements{}, fmt.Errorf("memory limit %s is below the memory request %s", q.String(), memReq.String())
		}
		memLim = q.DeepCopy()
	}
	if h := vmi.Spec.Domain.MemoryHugepages(); h != nil {
		if h.PageSizeBytes() == 0 {
			return corev1.ResourceRequirements{}, fmt.Errorf("huge page size %q is not one of %s", h.PageSize, strings.Join(v1alpha1.HugepageSizes, ", "))
		}
		req[h.ResourceName()], lim[h.ResourceName()] = guest.DeepCopy(), guest.DeepCopy()
		memReq, memLim = beyond(memReq, guest), beyond(memLim, guest)
	}
	memReq.Add(cfg.LauncherMemoryOverhead)
	memLim.Add(cfg.LauncherMemoryOverhead)
	req[corev1.ResourceMemory], lim[corev1.ResourceMemory] = memReq, memLim

	switch {
	case !vr.Requests.Cpu().IsZero():
		req[corev1.ResourceCPU] = vr.Requests.Cpu().DeepCopy()
	case !vr.Limits.Cpu().IsZero():
		req[corev1.ResourceCPU] = vr.Limits.Cpu().DeepCopy()
	default:
		// Neither is set, so the vCPUs are the topology's, or 1.
		vcpus, _ := vmi.Spec.Domain.VCPUs()
		q := cfg.CPURequestPerVCPU.DeepCopy()
		q.Mul(vcpus)
		req[corev1.ResourceCPU] = q
	}
	if !vr.Limits.Cpu().IsZero() {
		lim[corev1.ResourceCPU] = vr.Limits.Cpu().DeepCopy()
	}

	dedicated := vmi.Spec.Domain.DedicatedCPUs()
	if dedicated > 0 {
		// Whole CPUs, requests = limits: the static CPU manager gives the container exclusive
		// CPUs only so.
		n := *resource.NewQuantity(dedicated, resource.DecimalSI)
		req[corev1.ResourceCPU], lim[corev1.ResourceCPU] = n, n.DeepCopy()
	}

	if class.Overhead != nil {
		for name, q := range class.Overhead.PodFixed {
			if name == corev1.ResourceCPU && dedicated > 0 {
				continue // a fraction of a CPU more would cost the exclusive CPUs
			}
			add(req, name, q)
			// A limit grows with the overhead only where there is one (memory always); adding a
			// CPU limit the VMI did not ask for would throttle it.
			if _, ok := lim[name]; ok {
				add(lim, name, q)
			}
		}
	}

	if dedicated > 0 {
		// The Guaranteed QoS class: memory requests = limits too.
		req[corev1.ResourceMemory] = lim[corev1.ResourceMemory].DeepCopy()
	}

	for _, d := range class.DeviceResources {
		if !strings.HasPrefix(string(d), v1alpha1.DeviceResourcePrefix) || len(d) == len(v1alpha1.DeviceResourcePrefix) {
			return corev1.ResourceRequirements{}, fmt.Errorf("HypervisorClass %s: device resource %q is not a %s<name> resource", class.Name, d, v1alpha1.DeviceResourcePrefix)
		}
		req[d], lim[d] = resource.MustParse("1"), resource.MustParse("1")
	}
	// One of its deviceName per GPU and host device: the extended resource a device plugin
	// (devices.kubevisor.io/<name> from a device driver, or another vendor's) allocates it from.
	var devs []struct{ field, name string }
	for i, g := range vmi.Spec.Domain.Devices.GPUs {
		devs = append(devs, struct{ field, name string }{fmt.Sprintf("spec.domain.devices.gpus[%d].deviceName", i), g.DeviceName})
	}
	for i, h := range vmi.Spec.Domain.Devices.HostDevices {
		devs = append(devs, struct{ field, name string }{fmt.Sprintf("spec.domain.devices.hostDevices[%d].deviceName", i), h.DeviceName})
	}
	for _, d := range devs {
		if err := v1alpha1.CheckDeviceName(d.name); err != nil {
			return corev1.ResourceRequirements{}, fmt.Errorf("%s %q: %w", d.field, d.name, err)
		}
		add(req, corev1.ResourceName(d.name), resource.MustParse("1"))
		add(lim, corev1.ResourceName(d.name), resource.MustParse("1"))
	}
	if ls := vmi.Spec.Domain.LaunchSecurity; ls != nil && ls.SEV != nil {
		// QEMU opens /dev/sev to launch the guest; only nodes that offer it can run the VMI.
		req[v1alpha1.SEVDeviceResource], lim[v1alpha1.SEVDeviceResource] = resource.MustParse("1"), resource.MustParse("1")
	}
	return corev1.ResourceRequirements{Requests: req, Limits: lim}, nil
}

// beyond is what q exceeds base by, or zero.
func beyond(q, base resource.Quantity) resource.Quantity {
	q = q.DeepCopy()
	q.Sub(base)
	if q.Sign() < 0 {
		return resource.Quantity{Format: q.Format}
	}
	return q
}

func add(list corev1.ResourceList, name corev1.ResourceName, q resource.Quantity) {
	sum := list[name]
	sum.Add(q)
	list[name] = sum
}

// mergeNodeSelector is the VMI's node selector, its architecture (kubernetes.io/arch), the
// class's node selector and, with cpu.dedicatedCpuPlacement, kubevisor.io/cpumanager=true
// (v1alpha1.CPUManagerNodeLabel) together; a key set to different values is an error naming both, since
// no node can satisfy it.
func mergeNodeSelector(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range vmi.Spec.NodeSelector {
		out[k] = v
	}
	if arch := vmi.Spec.Architecture; arch != "" {
		if have, ok := out[corev1.LabelArchStable]; ok && have != arch {
			return nil, fmt.Errorf("node selector %s: the VMI wants %q and its architecture is %q", corev1.LabelArchStable, have, arch)
		}
		out[corev1.LabelArchStable] = arch
	}
	if class.Scheduling != nil {
		keys := make([]string, 0, len(class.Scheduling.NodeSelector))
		for k := range class.Scheduling.NodeSelector {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := class.Scheduling.NodeSelector[k]
			if have, ok := out[k]; ok && have != v {
				return nil, fmt.Errorf("node selector %s: the VMI wants %q and HypervisorClass %s wants %q", k, have, class.Name, v)
			}
			out[k] = v
		}
	}
	if vmi.Spec.Domain.DedicatedCPUs() > 0 {
		// Only a node whose kubelet runs the static CPU manager gives exclusive CPUs.
		if have, ok := out[v1alpha1.CPUManagerNodeLabel]; ok && have != "true" {
			return nil, fmt.Errorf("node selector %s: the VMI wants %q and cpu.dedicatedCpuPlacement needs \"true\"", v1alpha1.CPUManagerNodeLabel, have)
		}
		out[v1alpha1.CPUManagerNodeLabel] = "true"
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// AccelAttribute is the fingerprint attribute in which a hypervisor driver says how it runs VMs
// on its node (accel=kvm or accel=tcg; docs/driver-authoring.md, Fingerprint).
const AccelAttribute = "accel"

// TPMAttribute is the fingerprint attribute a hypervisor driver sets (to any value; qmp: the
// swtpm version) on the nodes where it gives VMs a TPM (the "tpm" device).
const TPMAttribute = "tpm"

// buildAffinity is the VMI's affinity with more required node terms: the class's hypervisor
// driver is healthy or degraded on the node (the label its handler publishes), and, when the VMI
// asks for what only exists under hardware virtualisation (DomainSpec.HardwareVirtualisationFields),
// the driver runs VMs with KVM there, and when it has a TPM, the driver gives VMs one there
// (TPMAttribute). Node selector terms are ORed, so the requirements join each of the VMI's
// terms.
func buildAffinity(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass) *corev1.Affinity {
	reqs := []corev1.NodeSelectorRequirement{{
		Key:      v1alpha1.DriverHealthLabel("hypervisor", class.Driver),
		Operator: corev1.NodeSelectorOpIn,
		Values:   []string{v1alpha1.DriverHealthy, v1alpha1.DriverDegraded},
	}}
	if len(vmi.Spec.Domain.HardwareVirtualisationFields()) > 0 {
		reqs = append(reqs, corev1.NodeSelectorRequirement{
			Key:      v1alpha1.DriverAttributeLabel(class.Driver, AccelAttribute),
			Operator: corev1.NodeSelectorOpIn,
			Values:   []string{"kvm"},
		})
	}
	if vmi.Spec.Domain.Devices.TPM.IsEnabled() {
		reqs = append(reqs, corev1.NodeSelectorRequirement{
			Key:      v1alpha1.DriverAttributeLabel(class.Driver, TPMAttribute),
			Operator: corev1.NodeSelectorOpExists,
		})
	}
	aff := &corev1.Affinity{}
	if vmi.Spec.Affinity != nil {
		aff = vmi.Spec.Affinity.DeepCopy()
	}
	if aff.NodeAffinity == nil {
		aff.NodeAffinity = &corev1.NodeAffinity{}
	}
	required := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if required == nil || len(required.NodeSelectorTerms) == 0 {
		aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}},
		}
		return aff
	}
	for i := range required.NodeSelectorTerms {
		t := &required.NodeSelectorTerms[i]
		t.MatchExpressions = append(t.MatchExpressions, reqs...)
	}
	return aff
}

// mergeTolerations is the VMI's tolerations followed by the class's, without exact duplicates.
func mergeTolerations(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass) []corev1.Toleration {
	var out []corev1.Toleration
	var fromClass []corev1.Toleration
	if class.Scheduling != nil {
		fromClass = class.Scheduling.Tolerations
	}
	for _, t := range slices.Concat(vmi.Spec.Tolerations, fromClass) {
		if !slices.ContainsFunc(out, func(o corev1.Toleration) bool {
			return o.MatchToleration(&t) && ptr.Equal(o.TolerationSeconds, t.TolerationSeconds)
		}) {
			out = append(out, t)
		}
	}
	return out
}

// hasClaims says whether the node handler mounts claims into the VMI's directory: those of its
// persistentVolumeClaim and ephemeral volumes (layout.ClaimMount) and its persistent state
// claim (layout.StateMount).
func hasClaims(vmi *v1alpha1.VirtualMachineInstance) bool {
	for _, v := range vmi.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return vmi.Spec.NeedsPersistentState()
}

// buildVolumes returns the pod's volumes and the launcher container's mounts (see the table in
// the package documentation).
func buildVolumes(vmi *v1alpha1.VirtualMachineInstance, cfg Config) ([]corev1.Volume, []corev1.VolumeMount, error) {
	dir := layout.VMIDir(cfg.HostStateDir, vmi.UID)
	volumes := []corev1.Volume{{
		Name:         VMIDirVolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	}}
	mounts := []corev1.VolumeMount{{
		Name: VMIDirVolumeName, MountPath: dir,
	}}
	names := map[string]bool{VMIDirVolumeName: true}
	hostDirs := map[string]string{} // hostDisk directory → pod volume name
	addVolume := func(name string, src corev1.VolumeSource, mount corev1.VolumeMount) error {
		if names[name] {
			return fmt.Errorf("volume %s: its name is taken by another volume of the launcher pod", name)
		}
		names[name] = true
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: src})
		mounts = append(mounts, mount)
		return nil
	}
	for _, v := range vmi.Spec.Volumes {
		var err error
		switch {
		case v.PersistentVolumeClaim != nil:
			claim := v.PersistentVolumeClaim.PersistentVolumeClaimVolumeSource
			err = addVolume(v.Name, corev1.VolumeSource{PersistentVolumeClaim: &claim},
				corev1.VolumeMount{Name: v.Name, MountPath: path.Join(DiskMountDir, v.Name), ReadOnly: claim.ReadOnly})
		case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
			// The claim is only the backing image of a copy-on-write layer kept in the per-VMI
			// directory: nothing writes to it.
			claim := *v.Ephemeral.PersistentVolumeClaim
			claim.ReadOnly = true
			err = addVolume(v.Name, corev1.VolumeSource{PersistentVolumeClaim: &claim},
				corev1.VolumeMount{Name: v.Name, MountPath: path.Join(DiskMountDir, v.Name), ReadOnly: true})
		case v.HostDisk != nil:
			hostDir := path.Dir(path.Clean(v.HostDisk.Path))
			if !path.IsAbs(hostDir) {
				return nil, nil, fmt.Errorf("volume %s: hostDisk path %q is not absolute", v.Name, v.HostDisk.Path)
			}
			if _, ok := hostDirs[hostDir]; ok {
				continue // another hostDisk in the same directory brought it already
			}
			typ := corev1.HostPathDirectory
			if v.HostDisk.Type == v1alpha1.HostDiskExistsOrCreate {
				typ = corev1.HostPathDirectoryOrCreate
			}
			hostDirs[hostDir] = v.Name
			// The same path inside as on the node, so the path in the VMI is the path QEMU opens.
			err = addVolume(v.Name, corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: ptr.To(typ)}},
				corev1.VolumeMount{Name: v.Name, MountPath: hostDir})
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if h := vmi.Spec.Domain.MemoryHugepages(); h != nil {
		// The kubelet mounts a hugetlbfs of the page size, limited to the pod's request of it;
		// QEMU makes the guest memory's file there (drivers see it as SandboxSpec.HugepagesDir).
		err := addVolume(HugepagesVolumeName,
			corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: h.HugepagesMedium()}},
			corev1.VolumeMount{Name: HugepagesVolumeName, MountPath: layout.HugepagesDir})
		if err != nil {
			return nil, nil, err
		}
	}
	if vmi.Spec.NeedsPersistentState() {
		// The VM's state that outlives the VMI: the node handler mounts it from here for the
		// hypervisor driver (StateClaim).
		err := addVolume(StateVolumeName,
			corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: StateClaimName(vmi)}},
			corev1.VolumeMount{Name: StateVolumeName, MountPath: layout.VMStateDir})
		if err != nil {
			return nil, nil, err
		}
	}
	for _, name := range vmi.Spec.SecretNames() {
		// Read-only, and readable by the launcher's user (root) only. Not optional: a missing
		// Secret keeps the pod from starting, and the kubelet's event names it.
		err := addVolume(SecretVolumeName(name),
			corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name, DefaultMode: ptr.To[int32](0o400)}},
			corev1.VolumeMount{Name: SecretVolumeName(name), MountPath: layout.SecretDir(name), ReadOnly: true})
		if err != nil {
			return nil, nil, err
		}
	}
	return volumes, mounts, nil
}

// SecretVolumeName is the launcher pod's volume of a Secret the VMI names: "secret-" and a hash
// of the Secret's name, which may be longer than a volume name can be.
func SecretVolumeName(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return SecretVolumePrefix + hex.EncodeToString(sum[:])[:12]
}

// security is the security context of the launcher pod's small helper containers: the
// launcher's user (root in a pod that is not unprivileged), nothing else: they only serve a
// socket, follow a file or copy one.
func security(unprivileged bool) *corev1.SecurityContext {
	uid := int64(0)
	if unprivileged {
		uid = layout.LauncherUID
	}
	return &corev1.SecurityContext{
		RunAsUser:                ptr.To(uid),
		RunAsNonRoot:             ptr.To(unprivileged),
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// buildContainerDisks returns a container per containerDisk volume and the pod volumes they use
// (nothing for a VMI without containerDisk volumes); taken are the pod's other volumes, whose
// names must not clash.
func buildContainerDisks(vmi *v1alpha1.VirtualMachineInstance, class *v1alpha1.HypervisorClass, cfg Config, taken []corev1.Volume, vmiDir corev1.VolumeMount, res corev1.ResourceRequirements) (initContainers, containers []corev1.Container, volumes []corev1.Volume, err error) {
	binMount := corev1.VolumeMount{Name: ContainerDiskBinVolumeName, MountPath: ContainerDiskBinDir, ReadOnly: true}
	// The per-VMI directory, where kubevisor-containerdisk serves its socket (ContainerDiskDir);
	// the handler's mounts there are for the compute container alone.
	dirMount := vmiDir
	dirMount.MountPropagation = nil
	names := map[string]string{} // container → volume
	for _, v := range vmi.Spec.Volumes {
		cd := v.ContainerDisk
		if cd == nil {
			continue
		}
		name := ContainerDiskContainer(v.Name)
		if other, ok := names[name]; ok {
			return nil, nil, nil, fmt.Errorf("volumes %s and %s: their containerDisk containers would have the same name %s", other, v.Name, name)
		}
		names[name] = v.Name
		pull := cd.ImagePullPolicy
		if pull == "" {
			pull = corev1.PullIfNotPresent
		}
		containers = append(containers, corev1.Container{
			Name:                     name,
			Image:                    cd.Image,
			ImagePullPolicy:          pull,
			Command:                  []string{path.Join(ContainerDiskBinDir, layout.ContainerDiskCommand)},
			Args:                     []string{"--socket", layout.ContainerDiskSocket(cfg.HostStateDir, vmi.UID, v.Name)},
			Resources:                *res.DeepCopy(),
			VolumeMounts:             []corev1.VolumeMount{binMount, dirMount},
			SecurityContext:          security(unprivileged(class)),
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		})
	}
	if len(containers) == 0 {
		return nil, nil, nil, nil
	}
	for _, v := range taken {
		if v.Name == ContainerDiskBinVolumeName {
			return nil, nil, nil, fmt.Errorf("volume %s: its name is taken by another volume of the launcher pod", v.Name)
		}
	}
	volumes = []corev1.Volume{{Name: ContainerDiskBinVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	install := corev1.Container{
		Name:                     ContainerDiskInstallContainer,
		Image:                    cfg.LauncherImage,
		ImagePullPolicy:          cfg.ImagePullPolicy,
		Command:                  []string{layout.ContainerDiskCommand, "--copy-to", ContainerDiskBinDir},
		Resources:                *res.DeepCopy(),
		VolumeMounts:             []corev1.VolumeMount{{Name: ContainerDiskBinVolumeName, MountPath: ContainerDiskBinDir}},
		SecurityContext:          security(unprivileged(class)),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	return []corev1.Container{install}, containers, volumes, nil
}

// KubeletProbe is the compute container's probe for a VMI's probe, nil for none; timings are
// copied, and a zero one is the kubelet's default, as in KubeVirt.
//
// The kubelet runs an httpGet or tcpSocket against the pod's address, which the guest's
// pod-network interface answers on (masquerade forwards the pod's ports to the guest, bridge
// gives the guest the pod's address), so those are the container's as they are. An exec or
// guestAgentPing acts through the guest agent, which only the node handler reaches (through the
// hypervisor driver): the container's probe is an exec of kubevisor-probe from the launcher
// image (layout.GuestProbeCommand), which asks the handler at socket (layout.GuestProbeSocket)
// and is given the probe's timeoutSeconds (default 1) to answer within. So, as with KubeVirt's
// virt-probe, the kubelet keeps the periods, thresholds and timeouts, and the pod's events say
// why a probe failed.
func KubeletProbe(p *v1alpha1.Probe, socket string) *corev1.Probe {
	if p == nil {
		return nil
	}
	out := &corev1.Probe{
		InitialDelaySeconds: p.InitialDelaySeconds,
		TimeoutSeconds:      p.TimeoutSeconds,
		PeriodSeconds:       p.PeriodSeconds,
		SuccessThreshold:    p.SuccessThreshold,
		FailureThreshold:    p.FailureThreshold,
	}
	if h := p.HTTPGet; h != nil {
		out.HTTPGet = h.DeepCopy()
	}
	if t := p.TCPSocket; t != nil {
		out.TCPSocket = t.DeepCopy()
	}
	if p.UsesGuestAgent() {
		timeout := p.TimeoutSeconds
		if timeout <= 0 {
			timeout = 1 // the kubelet's default
		}
		cmd := []string{layout.GuestProbeCommand, "--socket", socket, "--timeout", fmt.Sprintf("%ds", timeout)}
		if p.GuestAgentPing != nil {
			cmd = append(cmd, "ping")
		} else {
			cmd = append(append(cmd, "exec", "--"), p.Exec.Command...)
		}
		out.Exec = &corev1.ExecAction{Command: cmd}
	}
	return out
}
