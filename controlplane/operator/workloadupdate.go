package operator

import (
	"context"
	"fmt"
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

// CountOutdated writes the active Kubevisor's status.outdatedVirtualMachineInstanceWorkloads,
// how many VMIs carry v1alpha1.OutdatedLauncherImageLabel (kubevisor-controller's workload
// updater sets it), every recheck interval until ctx ends: the operator watches no VMI, so it
// counts them by an uncached list of their metadata alone, on its own, not in Reconcile (which
// would apply the whole install each time). It is the field's one writer. A failed count (no
// VMI CRD yet, during an uninstall) is logged and tried again.
func (r *Reconciler) CountOutdated(ctx context.Context) error {
	t := time.NewTicker(r.recheck())
	defer t.Stop()
	for {
		if err := r.countOutdated(ctx); err != nil {
			r.log(ctx).V(1).Info("count outdated VMIs", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *Reconciler) countOutdated(ctx context.Context) error {
	kv, err := r.active(ctx)
	if err != nil || kv == nil || kv.DeletionTimestamp != nil {
		return err
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("VirtualMachineInstanceList"))
	if err := r.Reader.List(ctx, list, client.HasLabels{v1alpha1.OutdatedLauncherImageLabel}); err != nil {
		return fmt.Errorf("list outdated VMIs: %w", err)
	}
	n := len(list.Items)
	if cur := kv.Status.OutdatedVirtualMachineInstanceWorkloads; cur != nil && *cur == n {
		return nil
	}
	orig := kv.DeepCopy()
	kv.Status.OutdatedVirtualMachineInstanceWorkloads = &n
	// A merge patch of this field alone: Reconcile's patches carry only what it changed.
	if err := r.Client.Status().Patch(ctx, kv, client.MergeFrom(orig)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("write status.outdatedVirtualMachineInstanceWorkloads: %w", err)
	}
	return nil
}
