// Package featuregate is Kubevisor's feature gates: the table of known gates (gates.go), a set
// of enabled ones read from the Kubevisor's spec.configuration.featureGates, kubevisor-api's
// --feature-gates or the live configuration (set.go), a holder that admission reads while the
// live configuration swaps it (live.go), and what each gate does to a VMI spec at admission
// (check.go).
//
// The names are KubeVirt's (its spec.configuration.developerConfiguration.featureGates), so a
// KubeVirt admin recognises them. A gate is either Gated (its feature is refused at admission
// unless the gate is listed) or GA (KubeVirt graduated it and Kubevisor always has the feature:
// listing it is accepted and changes nothing). Any other name is refused with its field path.
//
// A gate decides admission only: a VMI already running is never touched by a change of the
// enabled set.
package featuregate
