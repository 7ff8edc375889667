// Package manifests embeds Kubevisor's install manifests, as make generate writes them and
// kustomize reads them: the base manifests/install with its driver components
// (install/drivers/<name>), and the generated CRDs, RBAC and webhook configurations it
// includes. kubevisor-operator renders its installs from these (controlplane/operator), so an
// operator binary installs the manifests of the tree it was built from.
package manifests

import "embed"

// FS holds crd/, rbac/, webhook/ and install/ (with install/drivers/ and install/handler.d/),
// under those names.
//
//go:embed crd rbac webhook install
var FS embed.FS
