// Package edit declares the rights kubevisor.io:edit adds to kubevisor.io:view (hack/generate-rbac.sh
// generates the role from both packages); it is aggregated into the built-in edit role. As
// KubeVirt's kubevirt.io:edit: write VMs, VMIs and replica sets, reach into a VMI (console,
// VNC, port forward) and act on it and its VM; but no HypervisorClass writes (cluster
// configuration) and no migrations, which are kubevisor.io:migrate's.
package edit

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines;virtualmachineinstances;virtualmachineinstancereplicasets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=subresources.kubevisor.io,resources=virtualmachineinstances/console;virtualmachineinstances/vnc;virtualmachineinstances/portforward,verbs=get
// +kubebuilder:rbac:groups=subresources.kubevisor.io,resources=virtualmachineinstances/pause;virtualmachineinstances/unpause;virtualmachineinstances/softreboot;virtualmachineinstances/reset,verbs=update
// +kubebuilder:rbac:groups=subresources.kubevisor.io,resources=virtualmachines/start;virtualmachines/stop;virtualmachines/restart,verbs=update
