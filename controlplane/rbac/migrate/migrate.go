// Package migrate declares the ClusterRole kubevisor.io:migrate: start, cancel and manage live
// migrations (VirtualMachineInstanceMigrations and a VM's migrate and cancelmigration), as
// KubeVirt's kubevirt.io:migrate. Migrating moves load between nodes, which is the cluster's
// concern, so edit does not have it; the role is aggregated into the built-in admin role
// (namespace owners) and can be bound to anyone else who needs it.
package migrate

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch;create;update;patch;delete;deletecollection
// +kubebuilder:rbac:groups=subresources.kubevisor.io,resources=virtualmachines/migrate;virtualmachines/cancelmigration,verbs=update
