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
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kubevisor is the installation of Kubevisor in a cluster, as kubevisor-operator makes it: the
// driver set, the images, the configuration of the components and where they run. It is
// cluster-scoped and there is one: a second one is reported Degraded and not acted on. Its CRD
// comes with the operator (manifests/operator), not with the install it makes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=kv,categories=kubevisor
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".status.observedVersion"
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=".status.conditions[?(@.type=='Available')].status"
// +kubebuilder:printcolumn:name="Progressing",type="string",JSONPath=".status.conditions[?(@.type=='Progressing')].status"
// +kubebuilder:printcolumn:name="Degraded",type="string",JSONPath=".status.conditions[?(@.type=='Degraded')].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Kubevisor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec KubevisorSpec `json:"spec,omitempty"`
	// +optional
	Status KubevisorStatus `json:"status,omitempty"`
}

// KubevisorSpec is the wanted installation.
// +kubebuilder:validation:XValidation:rule="!has(self.workloads) || !has(self.workloads.replicas)",message="workloads.replicas: the node agent is a DaemonSet, one pod per node"
type KubevisorSpec struct {
	// Drivers is the driver set: the in-tree drivers of this release by name (qmp, libvirt,
	// cni, local, hostdev, fake), each with its handler configuration. A hypervisor driver
	// brings its HypervisorClass; dropping one deletes its class, which is refused while a VMI
	// uses it.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Drivers []KubevisorDriver `json:"drivers"`
	// ImageRegistry, when set, replaces the registry part of the component images
	// (kubevisor/kubevisor-<component> becomes <imageRegistry>/kubevisor-<component>).
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.:]*[a-z0-9])?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*$`
	// +optional
	ImageRegistry string `json:"imageRegistry,omitempty"`
	// ImageTag is the version of the components' images; empty means the operator's own.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`
	// +optional
	ImageTag string `json:"imageTag,omitempty"`
	// Configuration of the components.
	// +optional
	Configuration KubevisorConfiguration `json:"configuration,omitempty"`
	// CertificateRotateStrategy sets the lifetimes of the control plane's self-signed
	// certificates (webhooks, subresource API, handler streams, migration CA), which
	// kubevisor-api makes and renews before they expire.
	// +optional
	CertificateRotateStrategy *CertificateRotateStrategy `json:"certificateRotateStrategy,omitempty"`
	// Infra places the control plane (kubevisor-controller and kubevisor-api), and sets how
	// many pods each runs.
	// +optional
	Infra *ComponentPlacement `json:"infra,omitempty"`
	// Workloads places the node agent (the kubevisor-handler DaemonSet), so the nodes where
	// VMs may run.
	// +optional
	Workloads *ComponentPlacement `json:"workloads,omitempty"`
	// UninstallStrategy says what deleting this object does while VMs or VMIs exist:
	// BlockUninstallIfWorkloadsExist (the default) keeps everything and says so in the
	// Degraded condition until they are gone; RemoveWorkloads deletes them first.
	// +kubebuilder:validation:Enum=BlockUninstallIfWorkloadsExist;RemoveWorkloads
	// +kubebuilder:default=BlockUninstallIfWorkloadsExist
	// +optional
	UninstallStrategy UninstallStrategy `json:"uninstallStrategy,omitempty"`
	// WorkloadUpdateStrategy says what kubevisor-controller does with running VMIs whose
	// launcher pod runs another launcher image than its own (after an upgrade): it always marks
	// them (OutdatedLauncherImageLabel, counted in status.outdatedVirtualMachineInstanceWorkloads),
	// and with methods it live-migrates or evicts them in batches. Unset: mark only.
	// +optional
	WorkloadUpdateStrategy *WorkloadUpdateStrategy `json:"workloadUpdateStrategy,omitempty"`
}

// WorkloadUpdateStrategy is KubevisorSpec.WorkloadUpdateStrategy (KubeVirt's
// spec.workloadUpdateStrategy).
type WorkloadUpdateStrategy struct {
	// WorkloadUpdateMethods are how an outdated VMI gets a new launcher: LiveMigrate migrates
	// the VMIs that are LiveMigratable; Evict evicts the launcher pods of the others (of all
	// of them without LiveMigrate) through the Eviction API, so PodDisruptionBudgets and the
	// VMIs' eviction strategies apply, and a VM's runStrategy restarts it on the new launcher.
	// Empty (the default): the VMIs are marked and counted, nothing else.
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	// +optional
	WorkloadUpdateMethods []WorkloadUpdateMethod `json:"workloadUpdateMethods,omitempty"`
	// BatchEvictionSize is how many VMIs are migrated or evicted per batch (default 10).
	// +kubebuilder:validation:Minimum=1
	// +optional
	BatchEvictionSize *int `json:"batchEvictionSize,omitempty"`
	// BatchEvictionInterval is the time between two batches (default 1m, at least 1s).
	// +optional
	BatchEvictionInterval *metav1.Duration `json:"batchEvictionInterval,omitempty"`
}

// WorkloadUpdateMethod is one of WorkloadUpdateStrategy.WorkloadUpdateMethods.
// +kubebuilder:validation:Enum=LiveMigrate;Evict
type WorkloadUpdateMethod string

// The workload update methods.
const (
	WorkloadUpdateMethodLiveMigrate WorkloadUpdateMethod = "LiveMigrate"
	WorkloadUpdateMethodEvict       WorkloadUpdateMethod = "Evict"
)

// CertificateRotateStrategy is KubevisorSpec.CertificateRotateStrategy.
type CertificateRotateStrategy struct {
	// SelfSigned are the lifetimes of the self-signed CA and the certificates it signs.
	// +optional
	SelfSigned *SelfSignedCertificates `json:"selfSigned,omitempty"`
}

// SelfSignedCertificates are the lifetimes of the control plane's certificates; unset fields
// keep kubevisor-api's defaults (certificates 90 days, renewed 30 days before expiry, the CA
// four times a certificate's lifetime).
type SelfSignedCertificates struct {
	// CADuration is the CA's lifetime: at least twice CertDuration, so that a certificate
	// never outlives its CA.
	// +optional
	CADuration *metav1.Duration `json:"caDuration,omitempty"`
	// CertDuration is the serving and client certificates' lifetime (at least 10 minutes).
	// +optional
	CertDuration *metav1.Duration `json:"certDuration,omitempty"`
	// RenewBefore is how long before its expiry a certificate or the CA is renewed: at most
	// half of CertDuration. A renewed CA is added to the bundles the clients trust before it
	// signs anything, so no client is dropped.
	// +optional
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
	// NodeCertMaxDuration bounds the node handlers' migration certificates (their requests'
	// expirationSeconds are honoured up to it).
	// +optional
	NodeCertMaxDuration *metav1.Duration `json:"nodeCertMaxDuration,omitempty"`
}

// KubevisorDriver is one driver of the set: an in-tree driver by name, or a driver from its
// driver image (docs/driver-authoring.md), by name, kind and image.
// +kubebuilder:validation:XValidation:rule="!has(self.kind) || has(self.image)",message="kind is the kind of a driver image's driver: name the image too"
type KubevisorDriver struct {
	// Name is an in-tree driver of this release (manifests/install/drivers/<name>), or the name
	// of the driver that Image carries (its plugin manifest's name).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Image is a driver image (its binary and plugin manifest under /kubevisor/plugin): an init
	// container of the handler DaemonSet installs it into the nodes' plugin directory, where the
	// handler checks the binary's sha256 against the manifest before it loads it. For a
	// third-party driver Kind says its kind. On an in-tree driver (no Kind) it replaces the
	// binary of the handler image: a driver-only upgrade, the running VMs kept (the handler
	// rollout restarts the driver, which recovers them).
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`
	// Kind of the driver of Image: hypervisor (it gets a HypervisorClass of its name), network,
	// storage or device.
	// +kubebuilder:validation:Enum=hypervisor;network;storage;device
	// +optional
	Kind string `json:"kind,omitempty"`
	// Config is merged (RFC 7386 JSON merge patch) over the install's configuration of the
	// driver, and the node handlers pass the result to the driver (the handler configuration's
	// driverConfig.<name>); a change rolls the handler DaemonSet, which keeps the running VMs.
	// The hostdev driver's permittedHostDevices (PermittedHostDevices) are the exception: they
	// go to the live configuration, and the nodes' hostdev drivers take a change of them
	// without a restart.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +optional
	Config *apiextensionsv1.JSON `json:"config,omitempty"`
}

// UninstallStrategy is KubevisorSpec.UninstallStrategy.
type UninstallStrategy string

// The uninstall strategies.
const (
	UninstallBlockIfWorkloadsExist UninstallStrategy = "BlockUninstallIfWorkloadsExist"
	UninstallRemoveWorkloads       UninstallStrategy = "RemoveWorkloads"
)

// KubevisorConfiguration configures the components. A change rolls the components that take
// it as flags (kubevisor-controller, kubevisor-api); the VMs keep running.
type KubevisorConfiguration struct {
	// DefaultHypervisorClass is the class VMIs that name none run with: one of the driver
	// set's classes. Empty: the qmp class when the set has it, else the set's only class.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DefaultHypervisorClass string `json:"defaultHypervisorClass,omitempty"`
	// DefaultEvictionStrategy is the eviction strategy of VMIs that set none (KubeVirt's
	// evictionStrategy): None, LiveMigrate, LiveMigrateIfPossible or External.
	// +kubebuilder:validation:Enum=None;LiveMigrate;LiveMigrateIfPossible;External
	// +optional
	DefaultEvictionStrategy string `json:"defaultEvictionStrategy,omitempty"`
	// Migrations are the cluster's migration defaults, which a MigrationPolicy overrides.
	// +optional
	Migrations *KubevisorMigrations `json:"migrations,omitempty"`
	// LogVerbosity of each component.
	// +optional
	LogVerbosity *LogVerbosity `json:"logVerbosity,omitempty"`
	// FeatureGates turn on features that are off by default, by KubeVirt's names (its
	// developerConfiguration.featureGates): HostDisk (volumes[].hostDisk) and HostDevices
	// (domain.devices.hostDevices). KubeVirt's graduated GPU, LiveMigration and NUMA are accepted
	// and change nothing (always on); any other name is refused. Live: kubevisor-api admits by
	// the new list without a restart, and running VMIs are not touched (core/featuregate).
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	FeatureGates []string `json:"featureGates,omitempty"`
}

// KubevisorMigrations is KubevisorConfiguration.Migrations (KubeVirt's
// spec.configuration.migrations): the fields of one migration's configuration, and the limits
// on migrations at once. Unset fields keep kubevisor-controller's defaults; the operator refuses
// timeouts under 1 second and a negative bandwidth, naming the field.
type KubevisorMigrations struct {
	MigrationConfiguration `json:",inline"`
	// ParallelMigrationsPerCluster is how many migrations run at once in the cluster.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ParallelMigrationsPerCluster *int32 `json:"parallelMigrationsPerCluster,omitempty"`
	// ParallelOutboundMigrationsPerNode is how many migrations leave one node at once.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	ParallelOutboundMigrationsPerNode *int32 `json:"parallelOutboundMigrationsPerNode,omitempty"`
}

// LogVerbosity is KubevisorConfiguration.LogVerbosity.
type LogVerbosity struct {
	// Controller is kubevisor-controller's klog verbosity (its -v).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	// +optional
	Controller *int32 `json:"controller,omitempty"`
	// API is kubevisor-api's klog verbosity (its -v).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	// +optional
	API *int32 `json:"api,omitempty"`
	// Handler is the node handler's log level, which its drivers' logs follow.
	// +kubebuilder:validation:Enum=trace;debug;info;warn;error
	// +optional
	Handler string `json:"handler,omitempty"`
}

// ComponentPlacement is where a component's pods run (KubeVirt's ComponentConfig).
type ComponentPlacement struct {
	// NodeSelector is added to the pods' node selector.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations are added to the pods' tolerations.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity replaces the pods' affinity.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// Replicas is how many pods each of the placed Deployments runs: of kubevisor-controller
	// one leads and the others wait to take over, kubevisor-api's all serve. Default: one each.
	// Infra only (the node agent is a DaemonSet).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
}

// KubevisorStatus is what the operator observed and did.
type KubevisorStatus struct {
	// ObservedGeneration is the generation of the spec the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// TargetVersion is the image tag the operator is installing.
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`
	// ObservedVersion is the image tag of the last install that became Available.
	// +optional
	ObservedVersion string `json:"observedVersion,omitempty"`
	// Drivers is the driver set of the last install that became Available.
	// +listType=set
	// +optional
	Drivers []string `json:"drivers,omitempty"`
	// Conditions: Available (every component is ready at the target version), Progressing
	// (the operator is applying or a component is rolling out), Degraded (something needs the
	// admin: the reason and message name it).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Components has a line per workload of the install.
	// +listType=map
	// +listMapKey=name
	// +optional
	Components []KubevisorComponentStatus `json:"components,omitempty"`
	// OutdatedVirtualMachineInstanceWorkloads is how many VMIs carry OutdatedLauncherImageLabel:
	// they run on another launcher image than the installed one (the operator counts them
	// every recheck interval, 15s by default).
	// +optional
	OutdatedVirtualMachineInstanceWorkloads *int `json:"outdatedVirtualMachineInstanceWorkloads,omitempty"`
}

// The condition types of a Kubevisor.
const (
	KubevisorAvailable   = "Available"
	KubevisorProgressing = "Progressing"
	KubevisorDegraded    = "Degraded"
)

// KubevisorComponentStatus is one workload of the install.
type KubevisorComponentStatus struct {
	// Name of the Deployment or DaemonSet in kubevisor-system.
	Name string `json:"name"`
	// Kind is Deployment or DaemonSet.
	Kind string `json:"kind"`
	// Desired, Updated and Ready count its pods: wanted, at the current template, ready.
	Desired int32 `json:"desired"`
	Updated int32 `json:"updated"`
	Ready   int32 `json:"ready"`
	// Version is the image tag of its current template.
	// +optional
	Version string `json:"version,omitempty"`
	// Message says what it waits for, when it is not ready.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true

// KubevisorList is a list of Kubevisor.
type KubevisorList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Kubevisor `json:"items"`
}
