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

import "strings"

// Prefixes of the labels, annotations and resource names Kubevisor owns.
const (
	// LabelPrefix starts every label and annotation key that Kubevisor sets on objects.
	LabelPrefix = GroupName + "/"
	// CapabilityLabelPrefix starts the node labels a handler publishes from its drivers'
	// fingerprints (see DriverHealthLabel and DriverAttributeLabel); launcher pods get node
	// affinity on them. The handler owns every label with this prefix on its node.
	CapabilityLabelPrefix = "capability." + GroupName + "/"
	// DeviceResourcePrefix starts the extended resource names of Kubevisor's kubelet device plugins.
	DeviceResourcePrefix = "devices." + GroupName + "/"
)

// Labels Kubevisor sets.
const (
	// CreatedByLabel is set on a launcher pod to the UID of the VirtualMachineInstance it runs.
	CreatedByLabel = LabelPrefix + "created-by"
	// VirtualMachineInstanceNameLabel is set on a launcher pod to the name of the VirtualMachineInstance it runs.
	VirtualMachineInstanceNameLabel = LabelPrefix + "vmi-name"
	// VirtualMachineNameLabel is set on a VirtualMachineInstance to the name of the VirtualMachine that owns it.
	VirtualMachineNameLabel = LabelPrefix + "vm-name"
	// NodeNameLabel is set on a VirtualMachineInstance to the node that runs it, since CRDs have no field
	// selector on status.nodeName.
	NodeNameLabel = LabelPrefix + "node-name"
	// MigrationUIDLabel is set on the target launcher pod of a migration to the VirtualMachineInstanceMigration UID.
	MigrationUIDLabel = LabelPrefix + "migration-uid"
	// EvacuationLabel is set on a VirtualMachineInstanceMigration that the evacuation controller
	// created to move a VMI off a node, to that node's name.
	EvacuationLabel = LabelPrefix + "evacuation"
	// OutdatedLauncherImageLabel (value "") is set by kubevisor-controller's workload updater on
	// a running VirtualMachineInstance whose launcher pod runs another launcher image than the
	// controller's, and removed once it no longer does (KubeVirt's
	// kubevirt.io/outdatedLauncherImage).
	OutdatedLauncherImageLabel = LabelPrefix + "outdatedLauncherImage"
	// WorkloadUpdateLabel is set (value "true") on a VirtualMachineInstanceMigration that the
	// workload updater created to move a VMI to the current launcher image.
	WorkloadUpdateLabel = LabelPrefix + "workload-update"
	// HypervisorClassLabel is set on a launcher pod to the name of the HypervisorClass it was built for.
	HypervisorClassLabel = LabelPrefix + "hypervisor-class"
	// HypervisorDriverLabel is set on a launcher pod to the hypervisor driver of the
	// HypervisorClass it was built for: the driver the node handler runs its VMI with.
	HypervisorDriverLabel = LabelPrefix + "hypervisor-driver"
	// SchedulableNodeLabel is set to "true" by a handler on a node that can run VirtualMachineInstances.
	SchedulableNodeLabel = LabelPrefix + "schedulable"
	// CPUManagerNodeLabel is set to "true" on a node whose kubelet runs the static CPU manager
	// policy, which gives a Guaranteed pod's containers of whole CPUs exclusive CPUs. Launcher
	// pods of VMIs with cpu.dedicatedCpuPlacement select it. The handler sets it (and removes
	// it) from the kubelet's CPU manager state file, or leaves it to the admin when it is
	// given none; see core/handler/cluster.NodeLabeler.
	CPUManagerNodeLabel = LabelPrefix + "cpumanager"
	// SELinuxNodeLabel is set by a node's handler to the node's SELinux mode: "enforcing",
	// "permissive", or "disabled" (where launcher pods' SELinux levels are ignored and the
	// handler labels no file). See core/mcs.
	SELinuxNodeLabel = LabelPrefix + "selinux"
)

// IsHandlerNodeLabel says whether a node label is one the node handlers own and publish: a
// driver's capability (CapabilityLabelPrefix), SchedulableNodeLabel, CPUManagerNodeLabel and
// SELinuxNodeLabel. The handler leaves every other label alone; an uninstall removes these.
func IsHandlerNodeLabel(key string) bool {
	return strings.HasPrefix(key, CapabilityLabelPrefix) || key == SchedulableNodeLabel ||
		key == CPUManagerNodeLabel || key == SELinuxNodeLabel
}

// Annotations Kubevisor reads or sets.
const (
	// IsDefaultHypervisorClassAnnotation marks, with the value "true", the HypervisorClass used by
	// VirtualMachineInstances that name none (as storageclass.kubernetes.io/is-default-class does).
	IsDefaultHypervisorClassAnnotation = "hypervisorclass." + GroupName + "/is-default-class"
)

// TeardownFinalizer keeps a VirtualMachineInstance (or its launcher pod) until the node handler has
// released everything the drivers set up for it.
const TeardownFinalizer = LabelPrefix + "teardown"

// Extended resources served by Kubevisor's kubelet device plugins and requested by launcher pods.
const (
	// KVMDeviceResource grants /dev/kvm.
	KVMDeviceResource = DeviceResourcePrefix + "kvm"
	// TunDeviceResource grants /dev/net/tun.
	TunDeviceResource = DeviceResourcePrefix + "tun"
	// VhostNetDeviceResource grants /dev/vhost-net.
	VhostNetDeviceResource = DeviceResourcePrefix + "vhost-net"
	// SEVDeviceResource grants /dev/sev, which QEMU opens to launch an AMD SEV guest.
	SEVDeviceResource = DeviceResourcePrefix + "sev"
)

// Values of a DriverHealthLabel.
const (
	DriverHealthy   = "healthy"
	DriverDegraded  = "degraded"
	DriverUnhealthy = "unhealthy"
)

// DriverHealthLabel is the node label a handler sets to the health of a loaded driver
// (capability.kubevisor.io/<kind>.<driver> = healthy | degraded | unhealthy); kind is hypervisor,
// network, storage or device. Launcher pods of a HypervisorClass require its driver to be healthy
// or degraded on the node.
func DriverHealthLabel(kind, driver string) string {
	return CapabilityLabelPrefix + kind + "." + driver
}

// DriverMigrationLabel is the node label a handler sets on its node for each loaded hypervisor
// driver (capability.kubevisor.io/<driver>.live-migration = "true" | "false"): whether the driver
// declares live migration (FEATURE_HYPERVISOR_MIGRATE). A VMI whose driver says "false" on its
// node is not LiveMigratable (DriverNotLiveMigratable), and a migration's target pod requires
// "true" on its node. It wins over a fingerprint attribute of the same name.
func DriverMigrationLabel(driver string) string {
	return CapabilityLabelPrefix + driver + ".live-migration"
}

// DriverMigrationDisksLabel is the node label a handler sets on its node for each loaded
// hypervisor driver that declares live migration
// (capability.kubevisor.io/<driver>.live-migration-disks = "true" | "false"): whether the driver
// also copies a VMI's writable node-local disks (LocalWritableDisks) to the target
// (Capabilities.migration_disks). A VMI with such disks whose driver says "false" on its node is
// not LiveMigratable (DisksNotLiveMigratable), and its migration's target pod requires "true".
func DriverMigrationDisksLabel(driver string) string {
	return CapabilityLabelPrefix + driver + ".live-migration-disks"
}

// DriverMigrationPostCopyLabel is the node label a handler sets on its node for each loaded
// hypervisor driver that declares live migration
// (capability.kubevisor.io/<driver>.live-migration-post-copy = "true" | "false"): whether the
// driver switches a migration to post-copy where the configuration allows it
// (Capabilities.migration_post_copy). Where it says "false", allowPostCopy is a permission the
// driver does not use: a migration that does not converge is cancelled at its completion timeout.
func DriverMigrationPostCopyLabel(driver string) string {
	return CapabilityLabelPrefix + driver + ".live-migration-post-copy"
}

// DriverAttributeLabel is the node label a handler sets to a fingerprint attribute of a loaded
// driver (capability.kubevisor.io/<driver>.<attribute>, for example capability.kubevisor.io/qmp.accel).
func DriverAttributeLabel(driver, attribute string) string {
	return CapabilityLabelPrefix + driver + "." + attribute
}

// Reasons used in condition reasons and event reasons alike, so that a Warning event and the
// condition it explains carry the same string.
const (
	// ReasonPodTerminating says the launcher pod is terminating (Ready=False).
	ReasonPodTerminating = "PodTerminating"
	// ReasonPodNotExists says the launcher pod does not exist (Ready=False).
	ReasonPodNotExists = "PodNotExists"
	// ReasonPodFailed says the launcher pod failed, or completed, before its VMI was final
	// (the VMI's phase is Failed).
	ReasonPodFailed = "PodFailed"
	// ReasonGuestNotRunning says the guest is not running (Ready=False); before the launcher
	// pod runs, that the pod is not running yet. A container of the pod that waits on an error
	// gives Ready=False the kubelet's reason instead (ErrImagePull, ImagePullBackOff, ...).
	ReasonGuestNotRunning = "GuestNotRunning"
	// ReasonReadinessProbeFailed says the guest runs but the VMI's readiness probe has not
	// succeeded (Ready=False): the launcher pod is not Ready.
	ReasonReadinessProbeFailed = "ReadinessProbeFailed"
	// ReasonLivenessProbeFailed is the reason of a Failed VMI whose liveness probe failed: the
	// kubelet stopped the launcher pod's compute container, which held the guest.
	ReasonLivenessProbeFailed = "LivenessProbeFailed"
	// ReasonHypervisorClassNotFound says the named HypervisorClass does not exist, or none is default.
	ReasonHypervisorClassNotFound = "HypervisorClassNotFound"
	// ReasonMultipleDefaultHypervisorClasses says more than one HypervisorClass is marked default.
	ReasonMultipleDefaultHypervisorClasses = "MultipleDefaultHypervisorClasses"
	// ReasonDriverNotFound says the class's driver is not loaded on the node.
	ReasonDriverNotFound = "DriverNotFound"
	// ReasonDriverError says a driver call failed.
	ReasonDriverError = "DriverError"
	// ReasonUnschedulable says the launcher pod cannot be scheduled.
	ReasonUnschedulable = "Unschedulable"
	// ReasonSuccessfulCreate says an owned object (VMI, launcher pod) was created.
	ReasonSuccessfulCreate = "SuccessfulCreate"
	// ReasonFailedCreate says creating an owned object failed.
	ReasonFailedCreate = "FailedCreate"
	// ReasonSuccessfulDelete says an owned object was deleted.
	ReasonSuccessfulDelete = "SuccessfulDelete"
	// ReasonFailedDelete says deleting an owned object failed.
	ReasonFailedDelete = "FailedDelete"
	// ReasonStarted says the guest was started.
	ReasonStarted = "Started"
	// ReasonShuttingDown says a graceful guest shutdown was requested.
	ReasonShuttingDown = "ShuttingDown"
	// ReasonStopped says the guest stopped.
	ReasonStopped = "Stopped"
	// ReasonPaused says the guest was paused by a user.
	ReasonPaused = "PausedByUser"
	// ReasonResumed says the guest was resumed.
	ReasonResumed = "Resumed"
	// ReasonSyncFailed says the handler could not bring the guest to the VMI's spec (Synchronized=False).
	ReasonSyncFailed = "SyncFailed"
	// ReasonMigrating says a live migration started.
	ReasonMigrating = "Migrating"
	// ReasonMigrated says a live migration succeeded.
	ReasonMigrated = "Migrated"
	// ReasonMigrationFailed says a live migration failed.
	ReasonMigrationFailed = "MigrationFailed"
	// ReasonDisksNotLiveMigratable says a disk prevents live migration (LiveMigratable=False).
	ReasonDisksNotLiveMigratable = "DisksNotLiveMigratable"
	// ReasonInterfaceNotLiveMigratable says a network interface prevents live migration (LiveMigratable=False).
	ReasonInterfaceNotLiveMigratable = "InterfaceNotLiveMigratable"
	// ReasonHostDeviceNotLiveMigratable says a host device or GPU passed through to the guest
	// prevents live migration (LiveMigratable=False).
	ReasonHostDeviceNotLiveMigratable = "HostDeviceNotLiveMigratable"
	// ReasonDriverNotLiveMigratable says the hypervisor driver does not declare the migrate capability
	// (LiveMigratable=False).
	ReasonDriverNotLiveMigratable = "DriverNotLiveMigratable"
	// ReasonCrashLoopBackOff says the VM controller waits before starting a VMI that failed repeatedly.
	ReasonCrashLoopBackOff = "CrashLoopBackOff"
	// ReasonErrImagePull is the kubelet's reason for a container whose image could not be
	// pulled; a launcher pod's container waiting on it gives the VMI Ready=False with it.
	ReasonErrImagePull = "ErrImagePull"
	// ReasonImagePullBackOff is the kubelet's reason for a container whose image pull is retried
	// after failing (Ready=False, as ReasonErrImagePull).
	ReasonImagePullBackOff = "ImagePullBackOff"
	// ReasonFailedPvcNotFound says a PersistentVolumeClaim a VMI's volume names does not exist;
	// no launcher pod is created until it does (LauncherPodCreated=False, Ready=False). The
	// word is KubeVirt's.
	ReasonFailedPvcNotFound = "FailedPvcNotFound"
	// ReasonWaitingForVolumeBinding says a PersistentVolumeClaim a VMI's volume names exists
	// but is not bound to a volume yet (Ready=False while the launcher pod waits).
	ReasonWaitingForVolumeBinding = "WaitingForVolumeBinding"
)
