// Package apiserver declares the rights kubevisor-api's aggregated subresource API
// (subresources.kubevisor.io, controlplane/subresources) needs to serve its requests:
// hack/generate-webhook.sh adds them to the role kubevisor-api. Authentication and
// authorization delegated to the API server (TokenReview, SubjectAccessReview, the
// extension-apiserver-authentication ConfigMap) come from the built-in roles
// system:auth-delegator and extension-apiserver-authentication-reader, bound in
// manifests/install/rbac.yaml.
package apiserver

// The handler pods (the endpoint of a VMI's node), in the install namespace only.
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=pods,verbs=list;watch

// The VM and VMI a request names; start, stop, restart and the pause state are patches.
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines;virtualmachineinstances,verbs=get;patch

// migrate and cancelmigration create, find and delete a VMI's migrations.
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=create;get;list;delete
