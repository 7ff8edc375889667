package handler

import (
	"fmt"
	"slices"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// Health label values.
const (
	HealthHealthy   = v1alpha1.DriverHealthy
	HealthDegraded  = v1alpha1.DriverDegraded
	HealthUnhealthy = v1alpha1.DriverUnhealthy
)

// DriverFingerprint is the last fingerprint of one configured driver.
type DriverFingerprint struct {
	// Kind is hypervisor, network, storage or device; Name the driver's name.
	Kind, Name string
	// Fingerprint is nil while the driver is not running or has sent none.
	Fingerprint *basev1.FingerprintResponse
	// Capabilities are what the driver declared when it loaded; nil while it is not loaded.
	Capabilities *basev1.Capabilities
}

// NodeLabels turns the drivers' fingerprints into node labels:
//
//	capability.kubevisor.io/<kind>.<driver> = healthy | degraded | unhealthy
//	capability.kubevisor.io/<driver>.<attribute> = <value>
//	capability.kubevisor.io/<driver>.live-migration = true | false   (hypervisor drivers)
//	capability.kubevisor.io/<driver>.live-migration-disks = true | false   (those that migrate)
//	capability.kubevisor.io/<driver>.live-migration-post-copy = true | false   (those that migrate)
//
// A driver without a fingerprint is unhealthy. A loaded hypervisor driver's live-migration
// label (v1alpha1.DriverMigrationLabel) says whether its capabilities declare
// FEATURE_HYPERVISOR_MIGRATE, and, for one that does, live-migration-disks whether they declare
// migration_disks and live-migration-post-copy whether they declare migration_post_copy; they
// replace attributes of those names. An attribute that does not make a valid label
// (key or value) is left out and said in problems.
func NodeLabels(drivers []DriverFingerprint) (labels map[string]string, problems []string) {
	labels = map[string]string{}
	for _, d := range drivers {
		health := HealthUnhealthy
		switch d.Fingerprint.GetHealth() {
		case basev1.Health_HEALTH_HEALTHY:
			health = HealthHealthy
		case basev1.Health_HEALTH_DEGRADED:
			health = HealthDegraded
		}
		key := v1alpha1.DriverHealthLabel(d.Kind, d.Name)
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("driver %q: label %q: %v", d.Name, key, errs))
			continue
		}
		labels[key] = health
		attrs := d.Fingerprint.GetAttributes()
		names := make([]string, 0, len(attrs))
		for a := range attrs {
			names = append(names, a)
		}
		sort.Strings(names)
		for _, a := range names {
			key, value := v1alpha1.DriverAttributeLabel(d.Name, a), attrs[a]
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				problems = append(problems, fmt.Sprintf("driver %q: attribute %q: label key %q: %v", d.Name, a, key, errs))
				continue
			}
			if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
				problems = append(problems, fmt.Sprintf("driver %q: attribute %q: label value %q: %v", d.Name, a, value, errs))
				continue
			}
			labels[key] = value
		}
		if d.Kind == "hypervisor" && d.Capabilities != nil {
			migrates := slices.Contains(d.Capabilities.GetFeatures(), basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
			labels[v1alpha1.DriverMigrationLabel(d.Name)] = strconv.FormatBool(migrates)
			if migrates {
				labels[v1alpha1.DriverMigrationDisksLabel(d.Name)] = strconv.FormatBool(d.Capabilities.GetMigrationDisks())
				labels[v1alpha1.DriverMigrationPostCopyLabel(d.Name)] = strconv.FormatBool(d.Capabilities.GetMigrationPostCopy())
			}
		}
	}
	return labels, problems
}
