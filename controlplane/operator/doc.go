// Package operator is kubevisor-operator: it installs, configures, upgrades and uninstalls
// Kubevisor from the cluster's one Kubevisor object (core/api/v1alpha1), as virt-operator does
// for KubeVirt from its KubeVirt object.
//
// # What it applies
//
// Renderer renders the install from the manifests embedded in the binary (package manifests:
// the kustomize base manifests/install, its driver components, and the generated CRDs, RBAC
// and webhook configurations that make generate writes), with kustomize's krusty, the library
// inside `kubectl kustomize`: the same objects `kubectl apply -k` of that base with the chosen
// components makes (TestRenderMatchesInstallScript holds it to hack/install.sh's render). It
// then applies the spec: image registry and tag, the drivers' configuration (merged over their
// component's, as a part of the handler configuration, so the handler ConfigMap's name changes
// and the DaemonSet rolls; all but the hostdev driver's permittedHostDevices, which are live),
// drivers from driver images (an init container each, a handler configuration part, a
// HypervisorClass for a hypervisor), the default class, the components' flags (eviction
// strategy, workload update strategy) and their placement, and the live configuration
// (core/liveconfig): the ConfigMap kubevisor-system/kubevisor-config holding the migration
// defaults and limits, the log verbosity of the controller, the api and the handler, and the
// permitted host devices of spec.drivers[hostdev].config, which those components (for the
// permitted host devices, each node's handler and its kubevisor-deviceplugins container, which
// reconfigure their running hostdev driver) watch and take without a restart. Those fields are
// neither flags nor handler configuration, so a change of them leaves the pod templates as
// they are. A bad spec is refused with each field's path, in the Degraded condition; the
// running install is kept.
//
// # How it applies
//
// Every object is applied with server-side apply as the field manager kubevisor-operator,
// forcing its fields (the install is the operator's; kubevisor-api's CA bundles in the webhook
// configurations and APIService are fields it does not set, so they stay), and carries the
// label app.kubernetes.io/managed-by=kubevisor-operator. CRDs go first and must be established.
// The workloads roll out one after the other on an upgrade: kubevisor-controller, the
// kubevisor-handler DaemonSet, kubevisor-api; each is updated only when those before it run the
// target version, so an image that cannot be pulled stops the rollout at the first component
// (its old pods keep running; the Degraded condition names the pod and the kubelet's reason).
// The handler's restart keeps the VMs: they live in their launcher pods, and the new handler
// re-adopts them (core/handler). Once everything runs the target, the objects the operator made
// that the spec no longer has are deleted (a dropped driver's class, the handler's previous
// ConfigMap). A driver set that drops a class VMIs use is refused before anything is applied.
//
// # Status
//
// A line per workload (pods wanted, updated, ready; the version of its template; what it waits
// for). Available: every workload ready at the target version, and it stays true during an
// upgrade while each workload serves. Progressing: applying or rolling out. Degraded: a refused
// spec, a failed apply, a pod that cannot pull its image or crash-loops, a blocked uninstall, a
// second Kubevisor (the oldest one is the install; the others are reported and not acted on).
//
// # Uninstall
//
// A finalizer holds a deleted Kubevisor until the install is gone. uninstallStrategy
// BlockUninstallIfWorkloadsExist (the default) waits while VMs, VMI replica sets, migrations or
// VMIs exist, naming them; RemoveWorkloads deletes them first, while the controller still runs
// to stop their guests. Then every object the operator made goes (workloads first, CRDs last)
// and the node labels the handlers published.
//
// # Trust and privilege
//
// The operator's roles are its +kubebuilder:rbac markers (manifests/operator/rbac, generated),
// and the envtest runs it as a user granted exactly those. It may create the install's roles,
// whose rights it does not hold itself, through the escalate and bind verbs restricted to the
// names of those roles; namespaced rights are Roles in kubevisor-system (and kube-system for the
// API server's authentication reader binding). Its cache holds only kubevisor-system's
// workloads and pods; VMIs and the objects to prune are read uncached.
//
// # Limits
//
// The configuration the components cannot take live is flags or the handler configuration, so
// a change of it restarts them (rolling; the VMs keep running): the eviction strategy, the
// workload update strategy, the drivers' configuration but hostdev's permittedHostDevices
// (hostdev's devRoot, sysfsRoot, pollInterval and charDevices roll the handlers), the driver
// set, images, placement. Permitted host devices the spec checks (selector, resource name) can
// still be refused by a node's hostdev driver (a resource of one of its character devices):
// only the nodes' logs say so, and they keep the devices before. The control plane's
// certificates are made and rotated by kubevisor-api; the operator sets their lifetimes
// (certificateRotateStrategy).
// VMIs whose launcher is of an older version are marked, and migrated or evicted per
// workloadUpdateStrategy, by kubevisor-controller (controlplane/workloadupdate); the operator
// renders its flags and counts the marked VMIs (status.outdatedVirtualMachineInstanceWorkloads).
// A guest's serial output while its node's handler is replaced is not in its console log (the
// handler writes that log).
package operator
