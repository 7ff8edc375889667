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
	"k8s.io/apimachinery/pkg/types"
)

// VirtualMachine is a virtual machine that persists across starts and stops: it holds the template
// of the VirtualMachineInstance it creates per its run strategy, and mirrors that VMI's state.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vm;vms,categories=kubevisor
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.printableStatus",description="Human Readable Status"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the desired virtual machine and whether it runs.
	Spec VirtualMachineSpec `json:"spec"`
	// Status is the observed state of the virtual machine.
	// +optional
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// VirtualMachineList is a list of VirtualMachines.
//
// +kubebuilder:object:root=true
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the VirtualMachines.
	Items []VirtualMachine `json:"items"`
}

// VirtualMachineRunStrategy says when the VM controller keeps a VMI running.
// +kubebuilder:validation:Enum=Always;RerunOnFailure;Manual;Halted;Once
type VirtualMachineRunStrategy string

// Run strategies, as in kubevirt.io/v1.
const (
	// RunStrategyUnknown is not a valid run strategy; it stands for "not set".
	RunStrategyUnknown VirtualMachineRunStrategy = ""
	// RunStrategyAlways keeps a VMI running, restarting it whenever it stops.
	RunStrategyAlways VirtualMachineRunStrategy = "Always"
	// RunStrategyHalted keeps no VMI running.
	RunStrategyHalted VirtualMachineRunStrategy = "Halted"
	// RunStrategyManual starts and stops the VMI only on start/stop requests.
	RunStrategyManual VirtualMachineRunStrategy = "Manual"
	// RunStrategyRerunOnFailure starts a VMI and restarts it only if it failed.
	RunStrategyRerunOnFailure VirtualMachineRunStrategy = "RerunOnFailure"
	// RunStrategyOnce runs a VMI once and never restarts it.
	RunStrategyOnce VirtualMachineRunStrategy = "Once"
)

// VirtualMachineSpec describes a virtual machine and whether it runs.
// +kubebuilder:validation:XValidation:rule="!(has(self.running) && has(self.runStrategy))",message="running and runStrategy are mutually exclusive"
type VirtualMachineSpec struct {
	// Running is the legacy on/off switch (true is runStrategy Always, false is Halted).
	// Mutually exclusive with runStrategy.
	// +optional
	Running *bool `json:"running,omitempty"`
	// RunStrategy says when a VMI is kept running. Mutually exclusive with running.
	// +optional
	RunStrategy *VirtualMachineRunStrategy `json:"runStrategy,omitempty"`
	// Template is the VirtualMachineInstance the VM creates.
	Template *VirtualMachineInstanceTemplateSpec `json:"template"`
}

// VirtualMachineInstanceTemplateSpec is the template of a VirtualMachineInstance.
type VirtualMachineInstanceTemplateSpec struct {
	// ObjectMeta holds the labels and annotations copied onto the VMI.
	// Unknown fields are kept, as KubeVirt does, so that KubeVirt manifests (which often carry
	// creationTimestamp: null here) apply unchanged.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +nullable
	// +optional
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the VirtualMachineInstance specification.
	// +optional
	Spec VirtualMachineInstanceSpec `json:"spec,omitempty"`
}

// VirtualMachinePrintableStatus is a human-readable summary of a VM's state (kubectl get vm).
// +kubebuilder:validation:Enum=Stopped;Provisioning;Starting;Running;Paused;Stopping;Terminating;CrashLoopBackOff;Migrating;Unknown;ErrorUnschedulable;ErrImagePull;ImagePullBackOff;ErrorPvcNotFound;DataVolumeError;WaitingForVolumeBinding
type VirtualMachinePrintableStatus string

// Printable statuses, as in kubevirt.io/v1.
const (
	// VirtualMachineStatusStopped means the VM is stopped and not expected to start.
	VirtualMachineStatusStopped VirtualMachinePrintableStatus = "Stopped"
	// VirtualMachineStatusProvisioning means resources of the VM are being provisioned.
	VirtualMachineStatusProvisioning VirtualMachinePrintableStatus = "Provisioning"
	// VirtualMachineStatusStarting means the VM is being prepared to run.
	VirtualMachineStatusStarting VirtualMachinePrintableStatus = "Starting"
	// VirtualMachineStatusRunning means the VM runs.
	VirtualMachineStatusRunning VirtualMachinePrintableStatus = "Running"
	// VirtualMachineStatusPaused means the VM is paused.
	VirtualMachineStatusPaused VirtualMachinePrintableStatus = "Paused"
	// VirtualMachineStatusStopping means the VM is being stopped.
	VirtualMachineStatusStopping VirtualMachinePrintableStatus = "Stopping"
	// VirtualMachineStatusTerminating means the VM and its resources are being deleted.
	VirtualMachineStatusTerminating VirtualMachinePrintableStatus = "Terminating"
	// VirtualMachineStatusCrashLoopBackOff means the VM keeps failing and waits before the next start.
	VirtualMachineStatusCrashLoopBackOff VirtualMachinePrintableStatus = "CrashLoopBackOff"
	// VirtualMachineStatusMigrating means the VM is being live-migrated.
	VirtualMachineStatusMigrating VirtualMachinePrintableStatus = "Migrating"
	// VirtualMachineStatusUnknown means the VM's state could not be obtained.
	VirtualMachineStatusUnknown VirtualMachinePrintableStatus = "Unknown"
	// VirtualMachineStatusUnschedulable means the launcher pod cannot be scheduled.
	VirtualMachineStatusUnschedulable VirtualMachinePrintableStatus = "ErrorUnschedulable"
	// VirtualMachineStatusErrImagePull means pulling an image of the VM failed.
	VirtualMachineStatusErrImagePull VirtualMachinePrintableStatus = "ErrImagePull"
	// VirtualMachineStatusImagePullBackOff means pulling an image of the VM failed and is being retried.
	VirtualMachineStatusImagePullBackOff VirtualMachinePrintableStatus = "ImagePullBackOff"
	// VirtualMachineStatusPvcNotFound means a PVC the VM uses does not exist.
	VirtualMachineStatusPvcNotFound VirtualMachinePrintableStatus = "ErrorPvcNotFound"
	// VirtualMachineStatusDataVolumeError is KubeVirt's DataVolume error; Kubevisor never sets it.
	VirtualMachineStatusDataVolumeError VirtualMachinePrintableStatus = "DataVolumeError"
	// VirtualMachineStatusWaitingForVolumeBinding means a PVC the VM uses is not bound yet.
	VirtualMachineStatusWaitingForVolumeBinding VirtualMachinePrintableStatus = "WaitingForVolumeBinding"
)

// VirtualMachineConditionType is the type of a VM condition.
type VirtualMachineConditionType string

// VM condition types.
const (
	// VirtualMachineReady means the VM's VMI runs and is ready.
	VirtualMachineReady VirtualMachineConditionType = "Ready"
	// VirtualMachineFailure means the VM controller failed to act on the VM (for example to create its VMI).
	VirtualMachineFailure VirtualMachineConditionType = "Failure"
	// VirtualMachinePaused means the VM's VMI is paused.
	VirtualMachinePaused VirtualMachineConditionType = "Paused"
	// VirtualMachineProvisioning means volumes of the VM are still being provisioned.
	VirtualMachineProvisioning VirtualMachineConditionType = "Provisioning"
)

// VirtualMachineCondition is one aspect of the state of a VM.
type VirtualMachineCondition struct {
	// Type of the condition.
	Type VirtualMachineConditionType `json:"type"`
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

// StateChangeRequestAction is a requested start or stop of a VM.
// +kubebuilder:validation:Enum=Start;Stop
type StateChangeRequestAction string

// State change request actions.
const (
	// StartRequest asks for a VMI to be started.
	StartRequest StateChangeRequestAction = "Start"
	// StopRequest asks for the VMI to be stopped.
	StopRequest StateChangeRequestAction = "Stop"
)

// VirtualMachineStateChangeRequest is a pending start or stop of a VM's VMI.
type VirtualMachineStateChangeRequest struct {
	// Action is Start or Stop.
	Action StateChangeRequestAction `json:"action"`
	// Data gives more detail for the action.
	// +optional
	Data map[string]string `json:"data,omitempty"`
	// UID is the UID of the VMI the request applies to, if any.
	// +optional
	UID *types.UID `json:"uid,omitempty"`
}

// VirtualMachineStartFailure counts consecutive failed starts, for crash-loop back-off.
type VirtualMachineStartFailure struct {
	// ConsecutiveFailCount is the number of starts in a row whose VMI failed.
	// +optional
	ConsecutiveFailCount int `json:"consecutiveFailCount,omitempty"`
	// LastFailedVMIUID is the UID of the last VMI that failed.
	// +optional
	LastFailedVMIUID types.UID `json:"lastFailedVMIUID,omitempty"`
	// RetryAfterTimestamp is when the next start may happen.
	// +optional
	RetryAfterTimestamp *metav1.Time `json:"retryAfterTimestamp,omitempty"`
}

// VirtualMachineStatus is the observed state of a VM.
type VirtualMachineStatus struct {
	// Created says the VM's VMI exists.
	// +optional
	Created bool `json:"created,omitempty"`
	// Ready says the VM's VMI runs and is ready.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// PrintableStatus is a human-readable summary of the VM's state.
	// +optional
	PrintableStatus VirtualMachinePrintableStatus `json:"printableStatus,omitempty"`
	// Conditions are aspects of the VM's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []VirtualMachineCondition `json:"conditions,omitempty"`
	// StateChangeRequests are pending starts and stops, applied in order.
	// +listType=atomic
	// +optional
	StateChangeRequests []VirtualMachineStateChangeRequest `json:"stateChangeRequests,omitempty"`
	// StartFailure counts consecutive failed starts, for crash-loop back-off.
	// +nullable
	// +optional
	StartFailure *VirtualMachineStartFailure `json:"startFailure,omitempty"`
	// ObservedGeneration is the generation of the VM the running VMI was created from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// DesiredGeneration is the generation of the VM the VMI should match.
	// +optional
	DesiredGeneration int64 `json:"desiredGeneration,omitempty"`
	// RunStrategy is the run strategy last acted upon.
	// +optional
	RunStrategy VirtualMachineRunStrategy `json:"runStrategy,omitempty"`
}
