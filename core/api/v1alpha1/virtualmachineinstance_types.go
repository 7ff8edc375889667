/*
Copyright 2026 The Kubevisor Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// VirtualMachineInstance is a running virtual machine: one guest in one launcher pod on one node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmi;vmis,categories=kubevisor
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="IP",type="string",JSONPath=".status.interfaces[0].ipAddress"
// +kubebuilder:printcolumn:name="NodeName",type="string",JSONPath=".status.nodeName"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Live-Migratable",type="string",JSONPath=".status.conditions[?(@.type=='LiveMigratable')].status",priority=1
// +kubebuilder:printcolumn:name="Paused",type="string",JSONPath=".status.conditions[?(@.type=='Paused')].status",priority=1
// +kubebuilder:printcolumn:name="Class",type="string",JSONPath=".status.hypervisorClassName",priority=1
// +kubebuilder:printcolumn:name="Driver",type="string",JSONPath=".status.hypervisorDriver",priority=1
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || (has(self.status) && has(self.status.phase))",message="status.phase, once set, is not removed"
type VirtualMachineInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the desired virtual machine.
	Spec VirtualMachineInstanceSpec `json:"spec"`
	// Status is the observed state of the virtual machine; it may trail the system.
	// +optional
	Status VirtualMachineInstanceStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceList is a list of VirtualMachineInstances.
//
// +kubebuilder:object:root=true
type VirtualMachineInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the VirtualMachineInstances.
	Items []VirtualMachineInstance `json:"items"`
}

// EvictionStrategy says what happens to a VMI when its node is drained.
// +kubebuilder:validation:Enum=None;LiveMigrate;LiveMigrateIfPossible;External
type EvictionStrategy string

// Eviction strategies.
const (
	// EvictionStrategyNone stops the VMI; its VirtualMachine's runStrategy decides whether it restarts.
	EvictionStrategyNone EvictionStrategy = "None"
	// EvictionStrategyLiveMigrate live-migrates the VMI and blocks eviction until it has moved.
	EvictionStrategyLiveMigrate EvictionStrategy = "LiveMigrate"
	// EvictionStrategyLiveMigrateIfPossible live-migrates the VMI if it is LiveMigratable, else acts as None.
	EvictionStrategyLiveMigrateIfPossible EvictionStrategy = "LiveMigrateIfPossible"
	// EvictionStrategyExternal blocks eviction and leaves the VMI to an external controller.
	EvictionStrategyExternal EvictionStrategy = "External"
)

// VirtualMachineInstanceSpec describes a virtual machine. Its fields mirror kubevirt.io/v1 for the
// subset Kubevisor supports; hypervisorClassName is Kubevisor's own.
type VirtualMachineInstanceSpec struct {
	// Domain is the virtual hardware of the VMI.
	Domain DomainSpec `json:"domain"`
	// NodeSelector must match a node's labels for the VMI to be scheduled on that node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Affinity holds the scheduling constraints of the launcher pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// Tolerations of the launcher pod.
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// PriorityClassName is the launcher pod's PriorityClass: its scheduling priority and
	// whether it may preempt lower-priority pods. Empty: the cluster's default priority.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// SchedulerName is the scheduler that places the launcher pod. Empty: the default
	// scheduler.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	SchedulerName string `json:"schedulerName,omitempty"`
	// StartStrategy Paused starts the VMI with its guest paused (its vCPUs never ran): it is
	// Running with the Paused condition until unpaused (vmctl unpause). The hypervisor driver
	// must offer "start-paused".
	// +kubebuilder:validation:Enum=Paused
	// +optional
	StartStrategy *StartStrategy `json:"startStrategy,omitempty"`
	// Architecture is the guest's CPU architecture; only amd64 (x86_64) is supported, and the
	// launcher pod is placed on amd64 nodes (kubernetes.io/arch).
	// +kubebuilder:validation:Enum=amd64
	// +optional
	Architecture string `json:"architecture,omitempty"`
	// EvictionStrategy says what happens to the VMI when its node is drained.
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`
	// TerminationGracePeriodSeconds is how long a graceful guest shutdown may take before the VMI is killed.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
	// Volumes that the VMI's disks refer to.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Volumes []Volume `json:"volumes,omitempty"`
	// LivenessProbe is a periodic check of the guest: when it fails, the kubelet stops the
	// launcher's compute container and the VMI ends Failed.
	// +optional
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
	// ReadinessProbe is a periodic check of the guest: the VMI is Ready, and its launcher pod
	// an endpoint of the Services that select it, only while it succeeds.
	// +optional
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`
	// Hostname of the guest and of the launcher pod. Defaults to the name of the VMI. The guest
	// gets it as cloud-init's local-hostname and in the DHCP answers of the pod network.
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// Subdomain makes the guest's FQDN "<hostname>.<subdomain>.<namespace>.svc.<cluster domain>".
	// +optional
	Subdomain string `json:"subdomain,omitempty"`
	// DNSPolicy is the launcher pod's DNS policy, which the guest's DNS follows through the pod
	// network (ClusterFirst, ClusterFirstWithHostNet, Default or None). Empty: ClusterFirst.
	// +kubebuilder:validation:Enum=ClusterFirstWithHostNet;ClusterFirst;Default;None
	// +optional
	DNSPolicy corev1.DNSPolicy `json:"dnsPolicy,omitempty"`
	// DNSConfig is merged into the DNS configuration that DNSPolicy gives the launcher pod;
	// with DNSPolicy None it is all of it, and must name a nameserver.
	// +optional
	DNSConfig *corev1.PodDNSConfig `json:"dnsConfig,omitempty"`
	// AccessCredentials are SSH public keys to give the guest: the keys of each one's Secret are
	// added to the ssh_authorized_keys of the VMI's cloud-init user data (propagationMethod
	// noCloud or configDrive names which cloud-init volume's).
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	// +optional
	AccessCredentials []AccessCredential `json:"accessCredentials,omitempty"`
	// Networks that the VMI's interfaces refer to.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Networks []Network `json:"networks,omitempty"`
	// HypervisorClassName names the cluster-scoped HypervisorClass (driver, parameters, overhead,
	// scheduling) that runs this VMI. Empty selects the default class.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	HypervisorClassName string `json:"hypervisorClassName,omitempty"`
}

// VirtualMachineInstancePhase is the coarse lifecycle state of a VMI.
// +kubebuilder:validation:Enum=Pending;Scheduling;Scheduled;Running;Succeeded;Failed;Unknown
type VirtualMachineInstancePhase string

// VMI phases, as in kubevirt.io/v1.
const (
	// VMIPhaseUnset is the phase of a VMI no controller has seen yet.
	VMIPhaseUnset VirtualMachineInstancePhase = ""
	// Pending means the VMI has been accepted by the system.
	Pending VirtualMachineInstancePhase = "Pending"
	// Scheduling means the launcher pod exists but is not yet scheduled and running.
	Scheduling VirtualMachineInstancePhase = "Scheduling"
	// Scheduled means the launcher pod runs on a node; the node handler takes over from here.
	Scheduled VirtualMachineInstancePhase = "Scheduled"
	// Running means the guest has been started.
	Running VirtualMachineInstancePhase = "Running"
	// Succeeded means the guest stopped by itself or was shut down gracefully.
	Succeeded VirtualMachineInstancePhase = "Succeeded"
	// Failed means the guest crashed, disappeared, or the VMI was deleted before it ever started.
	Failed VirtualMachineInstancePhase = "Failed"
	// Unknown means the state of the VMI could not be obtained, typically because its node is unreachable.
	Unknown VirtualMachineInstancePhase = "Unknown"
)

// VirtualMachineInstanceConditionType is the type of a VMI condition.
type VirtualMachineInstanceConditionType string

// VMI condition types.
const (
	// VirtualMachineInstanceReady means the guest runs and can serve requests.
	VirtualMachineInstanceReady VirtualMachineInstanceConditionType = "Ready"
	// VirtualMachineInstancePaused means a user paused the guest.
	VirtualMachineInstancePaused VirtualMachineInstanceConditionType = "Paused"
	// VirtualMachineInstanceProvisioning means volumes of the VMI are still being provisioned.
	VirtualMachineInstanceProvisioning VirtualMachineInstanceConditionType = "Provisioning"
	// VirtualMachineInstanceSynchronized is False when the node handler failed to bring the guest to the spec.
	VirtualMachineInstanceSynchronized VirtualMachineInstanceConditionType = "Synchronized"
	// VirtualMachineInstanceIsMigratable means the VMI can be live-migrated.
	VirtualMachineInstanceIsMigratable VirtualMachineInstanceConditionType = "LiveMigratable"
	// VirtualMachineInstanceLauncherPodCreated is False while the VMI controller cannot create the
	// VMI's launcher pod (no HypervisorClass, the pod could not be built or created); it is gone
	// once the pod exists.
	VirtualMachineInstanceLauncherPodCreated VirtualMachineInstanceConditionType = "LauncherPodCreated"
	// VirtualMachineInstanceAgentConnected is True while the guest agent answers the node
	// handler (guestOSInfo then holds what it reports), False with a reason while the VMI runs
	// and it does not; it is there only when the VMI's hypervisor driver talks to a guest agent.
	VirtualMachineInstanceAgentConnected VirtualMachineInstanceConditionType = "AgentConnected"
)

// Reasons of the AgentConnected condition.
const (
	// ReasonGuestAgentConnected: the guest agent answered.
	ReasonGuestAgentConnected = "GuestAgentConnected"
	// ReasonGuestAgentNotConnected: the guest has no agent running, or it does not answer.
	ReasonGuestAgentNotConnected = "GuestAgentNotConnected"
)

// VirtualMachineInstanceCondition is one aspect of the state of a VMI.
type VirtualMachineInstanceCondition struct {
	// Type of the condition.
	Type VirtualMachineInstanceConditionType `json:"type"`
	// Status of the condition: True, False or Unknown.
	Status corev1.ConditionStatus `json:"status"`
	// LastProbeTime is when the condition was last probed.
	// +nullable
	// +optional
	LastProbeTime metav1.Time `json:"lastProbeTime,omitempty"`
	// LastTransitionTime is when the condition last changed status.
	// +nullable
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	// Reason is a CamelCase word for the last transition.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is a human-readable explanation of the last transition.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the metadata.generation the condition was set from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// VirtualMachineInstancePhaseTransitionTimestamp is when a VMI entered a phase.
type VirtualMachineInstancePhaseTransitionTimestamp struct {
	// Phase entered.
	// +optional
	Phase VirtualMachineInstancePhase `json:"phase,omitempty"`
	// PhaseTransitionTimestamp is when the phase was entered.
	// +optional
	PhaseTransitionTimestamp metav1.Time `json:"phaseTransitionTimestamp,omitempty"`
}

// VirtualMachineInstanceNetworkInterface is the observed state of one guest network interface.
type VirtualMachineInstanceNetworkInterface struct {
	// IP is the first IP address of the interface (the first of IPs).
	// +optional
	IP string `json:"ipAddress,omitempty"`
	// MAC is the hardware address of the interface.
	// +optional
	MAC string `json:"mac,omitempty"`
	// Name of the interface; it is the name of the network the interface is connected to.
	// +optional
	Name string `json:"name,omitempty"`
	// IPs lists all IP addresses of the interface.
	// +listType=atomic
	// +optional
	IPs []string `json:"ipAddresses,omitempty"`
	// InterfaceName is the name of the interface inside the guest.
	// +optional
	InterfaceName string `json:"interfaceName,omitempty"`
	// InfoSource says where the data came from: domain, guest-agent, or both (comma-separated).
	// +optional
	InfoSource string `json:"infoSource,omitempty"`
}

// VirtualMachineInstanceGuestOSInfo is what the guest agent reports about the guest OS.
type VirtualMachineInstanceGuestOSInfo struct {
	// Name of the guest OS.
	// +optional
	Name string `json:"name,omitempty"`
	// KernelRelease of the guest OS.
	// +optional
	KernelRelease string `json:"kernelRelease,omitempty"`
	// Version of the guest OS.
	// +optional
	Version string `json:"version,omitempty"`
	// PrettyName of the guest OS.
	// +optional
	PrettyName string `json:"prettyName,omitempty"`
	// VersionID of the guest OS.
	// +optional
	VersionID string `json:"versionId,omitempty"`
	// KernelVersion of the guest OS.
	// +optional
	KernelVersion string `json:"kernelVersion,omitempty"`
	// Machine type of the guest OS.
	// +optional
	Machine string `json:"machine,omitempty"`
	// ID of the guest OS.
	// +optional
	ID string `json:"id,omitempty"`
}

// MigrationMode is the copy mode of a running live migration.
// +kubebuilder:validation:Enum=PreCopy;PostCopy;Paused
type MigrationMode string

// Migration modes.
const (
	// MigrationPreCopy copies memory before switching the guest over.
	MigrationPreCopy MigrationMode = "PreCopy"
	// MigrationPostCopy switches the guest over and fetches memory on demand.
	MigrationPostCopy MigrationMode = "PostCopy"
	// MigrationPaused copies memory with the guest paused at the source: the whole copy is
	// downtime. Drivers use it where a live copy would lose some of the guest's writes (the qmp
	// driver under emulation on QEMU before 9.0; docs/migration.md).
	MigrationPaused MigrationMode = "Paused"
)

// VirtualMachineInstanceMigrationState is the state of a VMI's latest live migration.
type VirtualMachineInstanceMigrationState struct {
	// StartTimestamp is when the migration began.
	// +nullable
	// +optional
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	// EndTimestamp is when the migration ended.
	// +nullable
	// +optional
	EndTimestamp *metav1.Time `json:"endTimestamp,omitempty"`
	// TargetNodeAddress is the address on the target node the source migrates to: the target
	// handler's migration proxy, host:port.
	// +optional
	TargetNodeAddress string `json:"targetNodeAddress,omitempty"`
	// TargetNodeDomainReadyTimestamp is when the target's VM was ready to receive the guest.
	// +nullable
	// +optional
	TargetNodeDomainReadyTimestamp *metav1.Time `json:"targetNodeDomainReadyTimestamp,omitempty"`
	// TargetNode is the node the VMI moves to.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// TargetPod is the launcher pod the VMI moves to.
	// +optional
	TargetPod string `json:"targetPod,omitempty"`
	// SourceNode is the node the VMI moves from.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// SourcePod is the launcher pod the VMI moves from.
	// +optional
	SourcePod string `json:"sourcePod,omitempty"`
	// Completed says the migration finished.
	// +optional
	Completed bool `json:"completed,omitempty"`
	// Failed says the migration failed.
	// +optional
	Failed bool `json:"failed,omitempty"`
	// AbortRequested says an abort of the migration was requested.
	// +optional
	AbortRequested bool `json:"abortRequested,omitempty"`
	// FailureReason says why the migration failed.
	// +optional
	FailureReason string `json:"failureReason,omitempty"`
	// MigrationUID is the UID of the VirtualMachineInstanceMigration driving the migration.
	// +optional
	MigrationUID types.UID `json:"migrationUid,omitempty"`
	// Mode is the copy mode the migration runs in.
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`
	// MigrationConfiguration is the configuration the migration runs with: the cluster's
	// defaults with the MigrationPolicy that selects the VMI applied.
	// +optional
	MigrationConfiguration *MigrationConfiguration `json:"migrationConfiguration,omitempty"`
	// MigrationPolicyName is the MigrationPolicy that applied, if one did.
	// +optional
	MigrationPolicyName *string `json:"migrationPolicyName,omitempty"`
}

// MigrationConfiguration is how one migration runs (KubeVirt's fields of the same name).
type MigrationConfiguration struct {
	// BandwidthPerMigration limits the migration's stream, bytes per second; 0 means no limit.
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// CompletionTimeoutPerGiB is how many seconds the migration may take per GiB it copies
	// before it is cancelled (or switched to post-copy when that is allowed).
	// +optional
	CompletionTimeoutPerGiB *int64 `json:"completionTimeoutPerGiB,omitempty"`
	// ProgressTimeout is how many seconds the migration may go without progress before it is
	// cancelled.
	// +optional
	ProgressTimeout *int64 `json:"progressTimeout,omitempty"`
	// AllowAutoConverge lets the hypervisor throttle the guest's vCPUs so that the copy converges.
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`
	// AllowPostCopy lets a migration that does not converge switch to post-copy.
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`
}

// VirtualMachineInstanceStatus is the observed state of a VMI. Several components write it, each
// its own fields (docs/architecture.md has the table); the API server refuses any write that moves
// the phase back or changes a final phase or its reason (VirtualMachineInstancePhase.CanMoveTo).
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || (has(self.phase) && (self.phase == oldSelf.phase || (!(oldSelf.phase in ['Succeeded', 'Failed']) && (self.phase in ['Succeeded', 'Failed', 'Unknown'] || oldSelf.phase in ['Pending', 'Unknown'] || (oldSelf.phase == 'Scheduling' && self.phase != 'Pending') || (oldSelf.phase == 'Scheduled' && self.phase == 'Running')))))",message="status.phase never moves back (Pending, Scheduling, Scheduled, Running, then Succeeded or Failed) and a final phase never changes"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || !(oldSelf.phase in ['Succeeded', 'Failed']) || (has(self.reason) ? has(oldSelf.reason) && self.reason == oldSelf.reason : !has(oldSelf.reason))",message="the reason of a final phase never changes"
type VirtualMachineInstanceStatus struct {
	// NodeName is the node the VMI runs on.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// Reason is a CamelCase word for why the VMI is in its phase, for example NodeUnresponsive.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Conditions are aspects of the VMI's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []VirtualMachineInstanceCondition `json:"conditions,omitempty"`
	// Phase is the coarse lifecycle state of the VMI.
	// +optional
	Phase VirtualMachineInstancePhase `json:"phase,omitempty"`
	// PhaseTransitionTimestamps records when the VMI entered each phase.
	// +listType=atomic
	// +optional
	PhaseTransitionTimestamps []VirtualMachineInstancePhaseTransitionTimestamp `json:"phaseTransitionTimestamps,omitempty"`
	// Interfaces are the observed network interfaces of the guest.
	// +listType=atomic
	// +optional
	Interfaces []VirtualMachineInstanceNetworkInterface `json:"interfaces,omitempty"`
	// GuestOSInfo is what the guest agent reports about the guest OS.
	// +optional
	GuestOSInfo VirtualMachineInstanceGuestOSInfo `json:"guestOSInfo,omitempty"`
	// MigrationState is the state of the latest live migration.
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`
	// EvacuationNodeName is the node the VMI must leave: an eviction of its launcher pod there
	// (kubectl drain) found an evictionStrategy that moves the VMI instead (LiveMigrate, or
	// LiveMigrateIfPossible with the VMI LiveMigratable) or leaves it to someone else (External).
	// The evacuation controller migrates the VMI away (not for External) and removes the field
	// once the VMI no longer runs on that node (KubeVirt's field).
	// +optional
	EvacuationNodeName string `json:"evacuationNodeName,omitempty"`
	// LauncherPodName is the name of the launcher pod that runs the VMI.
	// +optional
	LauncherPodName string `json:"launcherPodName,omitempty"`
	// HypervisorClassName is the HypervisorClass the VMI was resolved to (spec.hypervisorClassName or the default).
	// +optional
	HypervisorClassName string `json:"hypervisorClassName,omitempty"`
	// HypervisorDriver is the hypervisor driver that runs the VMI: its HypervisorClass's driver,
	// written with hypervisorClassName. The node handler runs the VMI with this driver, and
	// fails it naming the driver when the node does not load it.
	// +optional
	HypervisorDriver string `json:"hypervisorDriver,omitempty"`
	// VolumeStatus is what the control plane found of the VMI's volumes before it made the
	// launcher pod: for each persistentVolumeClaim and ephemeral volume, its bound claim's modes
	// and size, from which the node sizes the disk image it makes on an empty file-system claim
	// (KubeVirt's field).
	// +listType=map
	// +listMapKey=name
	// +optional
	VolumeStatus []VolumeStatus `json:"volumeStatus,omitempty"`
	// SELinuxLevel is the SELinux MCS level ("s0:cX,cY") of the VMI's launcher pods
	// (securityContext.seLinuxOptions.level), which no other VMI of the cluster has while this
	// one has a launcher pod: the VM process runs at it, and the node labels the VMI's files with
	// it where SELinux is enabled (package core/mcs). Kubevisor's field; KubeVirt's
	// selinuxContext is the launcher's whole context as its node reads it.
	// +kubebuilder:validation:Pattern=`^s0:c[0-9]+,c[0-9]+$`
	// +optional
	SELinuxLevel string `json:"selinuxLevel,omitempty"`
}

// VolumeStatus is the status of one volume of a VMI.
type VolumeStatus struct {
	// Name is the volume's name in spec.volumes.
	Name string `json:"name"`
	// PersistentVolumeClaimInfo is the bound claim of a persistentVolumeClaim or ephemeral volume.
	// +optional
	PersistentVolumeClaimInfo *PersistentVolumeClaimInfo `json:"persistentVolumeClaimInfo,omitempty"`
}

// PersistentVolumeClaimInfo is what a volume's claim offers, read from the claim once bound.
type PersistentVolumeClaimInfo struct {
	// ClaimName is the claim's name in the VMI's namespace.
	ClaimName string `json:"claimName,omitempty"`
	// AccessModes are the claim's bound access modes.
	// +listType=atomic
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// VolumeMode is Filesystem or Block.
	// +optional
	VolumeMode *corev1.PersistentVolumeMode `json:"volumeMode,omitempty"`
	// Capacity is the bound volume's size (the claim's status.capacity).
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`
	// Requests is what the claim asked for (its spec.resources.requests).
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
	// FilesystemOverhead is the fraction of a file-system claim's capacity kept free of the disk
	// image the node makes on it, as a decimal string ("0.055": KubeVirt's default).
	// +optional
	FilesystemOverhead string `json:"filesystemOverhead,omitempty"`
}

// DefaultFilesystemOverhead is the fraction of a file-system claim that the node leaves free of
// the disk image it makes there (KubeVirt's and CDI's default).
const DefaultFilesystemOverhead = "0.055"

// StartStrategy is how a VMI starts.
type StartStrategy string

// StartStrategyPaused starts the guest paused.
const StartStrategyPaused StartStrategy = "Paused"
