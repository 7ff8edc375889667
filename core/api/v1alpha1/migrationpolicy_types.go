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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MigrationPolicy sets how the live migrations of the VMIs it selects run, over the cluster's
// defaults. It is cluster-scoped and has the fields of KubeVirt's
// migrations.kubevirt.io/v1alpha1 MigrationPolicy, in this project's group (as every KubeVirt
// group maps to kubevisor.io). When several policies select a VMI, the most specific one applies
// (controlplane/migration's MatchPolicy; docs/migration.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=mp,categories=kubevisor
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type MigrationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the migration settings and the VMIs they apply to.
	Spec MigrationPolicySpec `json:"spec"`
}

// MigrationPolicyList is a list of MigrationPolicies.
//
// +kubebuilder:object:root=true
type MigrationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the MigrationPolicies.
	Items []MigrationPolicy `json:"items"`
}

// MigrationPolicySpec is the settings of a MigrationPolicy and the VMIs they apply to. A field
// left out keeps the cluster's default.
type MigrationPolicySpec struct {
	// AllowAutoConverge lets the hypervisor throttle the guest's vCPUs when the migration does
	// not converge (its memory is dirtied faster than it is copied).
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`
	// BandwidthPerMigration limits the bandwidth of each migration, in bytes per second; 0 means
	// no limit (as KubeVirt's).
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="must not be negative (0 means no limit)"
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// CompletionTimeoutPerGiB is how many seconds a migration may take per GiB of the guest's
	// memory (and of the local disks it copies) before it is cancelled.
	// +kubebuilder:validation:Minimum=1
	// +optional
	CompletionTimeoutPerGiB *int64 `json:"completionTimeoutPerGiB,omitempty"`
	// AllowPostCopy lets a migration that does not converge switch to post-copy: the guest runs
	// on the target and fetches its remaining memory from the source on demand.
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`
	// Selectors choose the VMIs the policy applies to.
	Selectors *MigrationPolicySelectors `json:"selectors"`
}

// MigrationPolicySelectors choose the VMIs a MigrationPolicy applies to: those whose own labels
// include every label of virtualMachineInstanceSelector and whose namespace's labels include every
// label of namespaceSelector. Empty selectors select every VMI.
type MigrationPolicySelectors struct {
	// NamespaceSelector is labels the VMI's namespace must have, each with the given value.
	// +optional
	NamespaceSelector MigrationLabelSelector `json:"namespaceSelector,omitempty"`
	// VirtualMachineInstanceSelector is labels the VMI must have, each with the given value.
	// +optional
	VirtualMachineInstanceSelector MigrationLabelSelector `json:"virtualMachineInstanceSelector,omitempty"`
}

// MigrationLabelSelector is a set of labels, each of which must be present with its value (KubeVirt's
// migration LabelSelector: a plain map, not a metav1.LabelSelector).
type MigrationLabelSelector map[string]string
