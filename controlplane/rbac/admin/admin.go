// Package admin declares the rights kubevisor.io:admin adds to kubevisor.io:edit (generated
// from the view, edit and admin packages); it is aggregated into the built-in admin role. As
// KubeVirt's kubevirt.io:admin, that is deleting collections and reading the cluster's
// MigrationPolicies (which only cluster administrators write). Migrations reach admin through
// kubevisor.io:migrate, which is aggregated into admin too.
package admin

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines;virtualmachineinstances;virtualmachineinstancereplicasets,verbs=deletecollection
// +kubebuilder:rbac:groups=kubevisor.io,resources=migrationpolicies,verbs=get;list;watch
