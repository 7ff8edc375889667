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

// VirtualMachineInstanceReplicaSet keeps a number of identical VirtualMachineInstances running.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.labelSelector
// +kubebuilder:resource:shortName=vmirs;vmirss,categories=kubevisor
// +kubebuilder:printcolumn:name="Desired",type="integer",JSONPath=".spec.replicas",description="Number of desired VirtualMachineInstances"
// +kubebuilder:printcolumn:name="Current",type="integer",JSONPath=".status.replicas",description="Number of managed and not final or deleted VirtualMachineInstances"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas",description="Number of managed VirtualMachineInstances which are ready to receive traffic"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type VirtualMachineInstanceReplicaSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the desired replica set.
	Spec VirtualMachineInstanceReplicaSetSpec `json:"spec"`
	// Status is the observed state of the replica set.
	// +nullable
	// +optional
	Status VirtualMachineInstanceReplicaSetStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceReplicaSetList is a list of VirtualMachineInstanceReplicaSets.
//
// +kubebuilder:object:root=true
type VirtualMachineInstanceReplicaSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the VirtualMachineInstanceReplicaSets.
	Items []VirtualMachineInstanceReplicaSet `json:"items"`
}

// VirtualMachineInstanceReplicaSetSpec describes a replica set of VMIs.
type VirtualMachineInstanceReplicaSetSpec struct {
	// Replicas is the number of desired VMIs. Defaults to 1.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Selector is a label query over the VMIs the replica set owns; it must match the template's labels.
	Selector *metav1.LabelSelector `json:"selector"`
	// Template is the VMI the replica set creates.
	Template *VirtualMachineInstanceTemplateSpec `json:"template"`
	// Paused stops the controller from creating or deleting VMIs.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// VirtualMachineInstanceReplicaSetConditionType is the type of a replica set condition.
type VirtualMachineInstanceReplicaSetConditionType string

// Replica set condition types.
const (
	// VirtualMachineInstanceReplicaSetReplicaFailure means a VMI could not be created or deleted.
	VirtualMachineInstanceReplicaSetReplicaFailure VirtualMachineInstanceReplicaSetConditionType = "ReplicaFailure"
	// VirtualMachineInstanceReplicaSetReplicaPaused means the replica set is paused.
	VirtualMachineInstanceReplicaSetReplicaPaused VirtualMachineInstanceReplicaSetConditionType = "ReplicaPaused"
)

// VirtualMachineInstanceReplicaSetCondition is one aspect of the state of a replica set.
type VirtualMachineInstanceReplicaSetCondition struct {
	// Type of the condition.
	Type VirtualMachineInstanceReplicaSetConditionType `json:"type"`
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

// VirtualMachineInstanceReplicaSetStatus is the observed state of a replica set.
type VirtualMachineInstanceReplicaSetStatus struct {
	// Replicas is the number of VMIs the replica set owns that are not final or deleted.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas is the number of owned VMIs that are ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Conditions are aspects of the replica set's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []VirtualMachineInstanceReplicaSetCondition `json:"conditions,omitempty"`
	// LabelSelector is the canonical string form of spec.selector, for the scale subresource (HPA).
	// +optional
	LabelSelector string `json:"labelSelector,omitempty"`
}
