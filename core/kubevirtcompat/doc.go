// Package kubevirtcompat says how Kubevisor's VirtualMachineInstanceSpec stands to KubeVirt's:
// the leaf fields of KubeVirt's spec (a list generated from its Go types), which of them
// Kubevisor supports (derived from core/api/v1alpha1, never listed by hand), why each other one
// is not supported and what to use instead, and the admission check that answers a KubeVirt
// field Kubevisor lacks with that reason rather than "unknown field".
package kubevirtcompat
