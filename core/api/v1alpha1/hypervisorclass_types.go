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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HypervisorClass names a hypervisor driver and how VMIs that use it are configured and placed.
// It is cluster-scoped and, like StorageClass, keeps its fields at the top level; one class may be
// marked default with the hypervisorclass.kubevisor.io/is-default-class: "true" annotation.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=hvc,categories=kubevisor
// +kubebuilder:printcolumn:name="Driver",type="string",JSONPath=".driver"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type HypervisorClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Driver is the name of the hypervisor driver plugin that runs VMIs of this class. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="driver is immutable"
	Driver string `json:"driver"`
	// Parameters are reserved for per-class driver settings. No hypervisor driver of this
	// release takes any, and the hypervisor contract has no way yet to pass them, so a class that
	// sets one is refused rather than accepted and ignored.
	// +kubebuilder:validation:XValidation:rule="size(self) == 0",message="no hypervisor driver of this release takes class parameters: remove them (the driver's settings are its handler configuration)"
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`
	// Overhead is added to the resources of the launcher pod of each VMI of this class.
	// +optional
	Overhead *HypervisorClassOverhead `json:"overhead,omitempty"`
	// Scheduling constrains the nodes that VMIs of this class run on.
	// +optional
	Scheduling *HypervisorClassScheduling `json:"scheduling,omitempty"`
	// DeviceResources are the kubelet device plugin resources (devices.kubevisor.io/<name>, one of
	// each) that every launcher pod of this class requests, for example devices.kubevisor.io/kvm
	// for a class that needs hardware acceleration. Launcher pods are not privileged: these are
	// the only host devices they get.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	DeviceResources []corev1.ResourceName `json:"deviceResources,omitempty"`
	// LauncherCapabilities are the Linux capabilities the compute container of each launcher
	// pod of this class keeps; it drops all others, as every launcher pod does. They are for a
	// driver whose VM manager the launcher starts as root and which must drop to an
	// unprivileged user itself (the libvirt driver's per-VMI daemon: setpriv needs SETUID and
	// SETGID). Only SETUID and SETGID are accepted: a launcher pod stays unprivileged, no new
	// privileges, and the VM process runs without any capability.
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=SETUID;SETGID
	// +optional
	LauncherCapabilities []corev1.Capability `json:"launcherCapabilities,omitempty"`
}

// HypervisorClassOverhead is the per-VMI resource overhead of a class (as RuntimeClass's Overhead).
type HypervisorClassOverhead struct {
	// PodFixed is added to the requests and limits of each launcher pod.
	// +optional
	PodFixed corev1.ResourceList `json:"podFixed,omitempty"`
}

// HypervisorClassScheduling constrains the nodes VMIs of a class run on (as RuntimeClass's Scheduling).
type HypervisorClassScheduling struct {
	// NodeSelector is merged into each launcher pod's node selector.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations are appended to each launcher pod's tolerations.
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// HypervisorClassList is a list of HypervisorClasses.
//
// +kubebuilder:object:root=true
type HypervisorClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the HypervisorClasses.
	Items []HypervisorClass `json:"items"`
}

// IsDefaultClass reports whether the class is annotated as the default HypervisorClass
// (IsDefaultHypervisorClassAnnotation set to exactly "true"). A nil class is not the default.
func IsDefaultClass(class *HypervisorClass) bool {
	if class == nil {
		return false
	}
	return class.Annotations[IsDefaultHypervisorClassAnnotation] == "true"
}
