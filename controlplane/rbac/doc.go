// Package rbac holds, one package per role, the +kubebuilder:rbac markers of roles whose rights
// belong to no single package of code: the user roles kubevisor.io:view, kubevisor.io:edit,
// kubevisor.io:admin and kubevisor.io:migrate (aggregated into the built-in view, edit and
// admin roles), and the rights of kubevisor-api's aggregated API server (apiserver).
// hack/generate-rbac.sh and hack/generate-webhook.sh turn them into manifests/rbac and
// manifests/webhook/role.yaml.
package rbac
