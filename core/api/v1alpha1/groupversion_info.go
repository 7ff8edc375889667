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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every Kubevisor resource.
const GroupName = "kubevisor.io"

var (
	// GroupVersion is the group and version of this package's types.
	GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Kinds of this group version, for owner references and typed errors.
var (
	// VirtualMachineGroupVersionKind is the GroupVersionKind of VirtualMachine.
	VirtualMachineGroupVersionKind = GroupVersion.WithKind("VirtualMachine")
	// VirtualMachineInstanceGroupVersionKind is the GroupVersionKind of VirtualMachineInstance.
	VirtualMachineInstanceGroupVersionKind = GroupVersion.WithKind("VirtualMachineInstance")
	// VirtualMachineInstanceReplicaSetGroupVersionKind is the GroupVersionKind of VirtualMachineInstanceReplicaSet.
	VirtualMachineInstanceReplicaSetGroupVersionKind = GroupVersion.WithKind("VirtualMachineInstanceReplicaSet")
	// VirtualMachineInstanceMigrationGroupVersionKind is the GroupVersionKind of VirtualMachineInstanceMigration.
	VirtualMachineInstanceMigrationGroupVersionKind = GroupVersion.WithKind("VirtualMachineInstanceMigration")
	// HypervisorClassGroupVersionKind is the GroupVersionKind of HypervisorClass.
	HypervisorClassGroupVersionKind = GroupVersion.WithKind("HypervisorClass")
	// KubevisorGroupVersionKind is the GroupVersionKind of Kubevisor.
	KubevisorGroupVersionKind = GroupVersion.WithKind("Kubevisor")
)

// Resource returns the GroupResource of the named resource (plural, lower case) in this group.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&VirtualMachine{}, &VirtualMachineList{},
		&VirtualMachineInstance{}, &VirtualMachineInstanceList{},
		&VirtualMachineInstanceReplicaSet{}, &VirtualMachineInstanceReplicaSetList{},
		&VirtualMachineInstanceMigration{}, &VirtualMachineInstanceMigrationList{},
		&HypervisorClass{}, &HypervisorClassList{},
		&MigrationPolicy{}, &MigrationPolicyList{},
		&Kubevisor{}, &KubevisorList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
