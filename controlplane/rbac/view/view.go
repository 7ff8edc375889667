// Package view declares the ClusterRole kubevisor.io:view, aggregated into the built-in view
// role: read every Kubevisor kind and a VMI's guest OS information, nothing that changes a VM
// or reaches into it (no console, VNC or port forward), as KubeVirt's kubevirt.io:view.
package view

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines;virtualmachineinstances;virtualmachineinstancereplicasets;virtualmachineinstancemigrations;hypervisorclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=subresources.kubevisor.io,resources=virtualmachineinstances/guestosinfo,verbs=get
