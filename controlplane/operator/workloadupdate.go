package operator

import (
	"context"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// countOutdated writes into kv's status how many VMIs carry v1alpha1.OutdatedLauncherImageLabel
// (kubevisor-controller's workload updater sets it), by an uncached list of their metadata
// alone, and returns how soon to count again: the recheck interval while some are outdated
// (the operator watches no VMI), else 0. When the VMIs cannot be listed (no CRD yet, a
// Kubevisor being deleted) the status keeps its last count.
func (r *Reconciler) countOutdated(ctx context.Context, kv *v1alpha1.Kubevisor) time.Duration {
	if kv.DeletionTimestamp != nil {
		return 0
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("VirtualMachineInstanceList"))
	if err := r.Reader.List(ctx, list, client.HasLabels{v1alpha1.OutdatedLauncherImageLabel}); err != nil {
		r.log(ctx).V(1).Info("count outdated VMIs", "error", err.Error())
		return 0
	}
	n := len(list.Items)
	kv.Status.OutdatedVirtualMachineInstanceWorkloads = &n
	if n > 0 {
		return r.recheck()
	}
	return 0
}
