package operator

import (
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// minBatchInterval is the shortest batchEvictionInterval: kubevisor-controller refuses less
// (controlplane/workloadupdate.MinBatchInterval).
const minBatchInterval = time.Second

// validateWorkloadUpdate checks spec.workloadUpdateStrategy as kubevisor-controller's flags
// would (the CRD's schema holds the enum and the minimum size too; this names the field when
// the operator is given a spec the API server did not check, as in tests).
func validateWorkloadUpdate(s *v1alpha1.WorkloadUpdateStrategy) field.ErrorList {
	if s == nil {
		return nil
	}
	p := field.NewPath("spec", "workloadUpdateStrategy")
	var errs field.ErrorList
	seen := map[v1alpha1.WorkloadUpdateMethod]bool{}
	for i, m := range s.WorkloadUpdateMethods {
		mp := p.Child("workloadUpdateMethods").Index(i)
		switch {
		case m != v1alpha1.WorkloadUpdateMethodLiveMigrate && m != v1alpha1.WorkloadUpdateMethodEvict:
			errs = append(errs, field.NotSupported(mp, m, []string{string(v1alpha1.WorkloadUpdateMethodLiveMigrate), string(v1alpha1.WorkloadUpdateMethodEvict)}))
		case seen[m]:
			errs = append(errs, field.Duplicate(mp, m))
		}
		seen[m] = true
	}
	if s.BatchEvictionSize != nil && *s.BatchEvictionSize < 1 {
		errs = append(errs, field.Invalid(p.Child("batchEvictionSize"), *s.BatchEvictionSize, "at least 1"))
	}
	if d := s.BatchEvictionInterval; d != nil && d.Duration < minBatchInterval {
		errs = append(errs, field.Invalid(p.Child("batchEvictionInterval"), d.Duration.String(), "at least "+minBatchInterval.String()))
	}
	return errs
}

// workloadUpdateFlags are kubevisor-controller's flags of the workload update strategy; unset
// fields keep its defaults (no method, 10 per batch, 1m between batches).
func workloadUpdateFlags(s *v1alpha1.WorkloadUpdateStrategy) map[string]string {
	f := map[string]string{}
	if s == nil {
		return f
	}
	if len(s.WorkloadUpdateMethods) > 0 {
		var ms []string
		for _, m := range s.WorkloadUpdateMethods {
			ms = append(ms, string(m))
		}
		f["workload-update-methods"] = strings.Join(ms, ",")
	}
	if s.BatchEvictionSize != nil {
		f["workload-update-batch-size"] = strconv.Itoa(*s.BatchEvictionSize)
	}
	if s.BatchEvictionInterval != nil {
		f["workload-update-batch-interval"] = s.BatchEvictionInterval.Duration.String()
	}
	return f
}
