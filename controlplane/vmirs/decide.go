package vmirs

import (
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ReasonInvalidSpec says the replica set cannot create VMIs as specified: no template, or a
// selector that is invalid, empty or does not match the template's labels (ReplicaFailure=True).
// constants.go has no such reason; it is used for the condition and the event alike.
const ReasonInvalidSpec = "InvalidSpec"

// Decision is what Decide concludes for one replica set.
type Decision struct {
	// Create is the number of VMIs to create from the template.
	Create int
	// Delete are the VMIs to delete: finished ones (to be replaced) and, when scaling down, the
	// active ones least worth keeping.
	Delete []*v1alpha1.VirtualMachineInstance
	// Status is the replica set status to write (counts are of the VMIs passed to Decide).
	Status v1alpha1.VirtualMachineInstanceReplicaSetStatus
	// Capped says more creations or deletions are due than burst allows in one reconcile.
	Capped bool
}

// Selector returns the replica set's selector, checked: it must be valid, non-empty (an empty one
// would claim every VMI of the namespace) and match the template's labels, or the VMIs it creates
// would not be its own.
func Selector(rs *v1alpha1.VirtualMachineInstanceReplicaSet) (labels.Selector, error) {
	if rs.Spec.Template == nil {
		return nil, fmt.Errorf("spec.template is not set")
	}
	if rs.Spec.Selector == nil {
		return nil, fmt.Errorf("spec.selector is not set")
	}
	sel, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("spec.selector: %w", err)
	}
	if sel.Empty() {
		return nil, fmt.Errorf("spec.selector is empty")
	}
	if !sel.Matches(labels.Set(rs.Spec.Template.ObjectMeta.Labels)) {
		return nil, fmt.Errorf("spec.selector %q does not match the labels of spec.template", sel.String())
	}
	return sel, nil
}

// Replicas is spec.replicas, 1 when unset (as in KubeVirt).
func Replicas(rs *v1alpha1.VirtualMachineInstanceReplicaSet) int {
	if rs.Spec.Replicas == nil {
		return 1
	}
	return int(*rs.Spec.Replicas)
}

func isFinal(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi.Status.Phase == v1alpha1.Succeeded || vmi.Status.Phase == v1alpha1.Failed
}

func isReady(vmi *v1alpha1.VirtualMachineInstance) bool {
	if vmi.Status.Phase != v1alpha1.Running {
		return false
	}
	c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// Decide is the replica set controller's logic: given the replica set and the VMIs it controls,
// it says how many VMIs to create, which to delete, and what the status becomes. Finished VMIs
// are deleted and replaced; VMIs already being deleted are neither counted nor touched. At most
// burst creations plus deletions are asked for at once (0 means no limit).
func Decide(rs *v1alpha1.VirtualMachineInstanceReplicaSet, vmis []*v1alpha1.VirtualMachineInstance, burst int, now time.Time) Decision {
	d := Decision{Status: *rs.Status.DeepCopy()}
	st := &d.Status
	st.LabelSelector = ""
	if rs.Spec.Selector != nil {
		st.LabelSelector = metav1.FormatLabelSelector(rs.Spec.Selector)
	}

	var active, final []*v1alpha1.VirtualMachineInstance
	for _, vmi := range vmis {
		switch {
		case vmi.DeletionTimestamp != nil:
		case isFinal(vmi):
			final = append(final, vmi)
		default:
			active = append(active, vmi)
		}
	}
	st.Replicas = int32(len(active))
	st.ReadyReplicas = 0
	for _, vmi := range active {
		if isReady(vmi) {
			st.ReadyReplicas++
		}
	}

	if rs.Spec.Paused {
		setCondition(st, rs.Generation, now, v1alpha1.VirtualMachineInstanceReplicaSetReplicaPaused, corev1.ConditionTrue,
			v1alpha1.ReasonPaused, "the replica set is paused: no VMI is created or deleted")
		return d
	}
	removeCondition(st, v1alpha1.VirtualMachineInstanceReplicaSetReplicaPaused)
	if _, err := Selector(rs); err != nil {
		setCondition(st, rs.Generation, now, v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, corev1.ConditionTrue, ReasonInvalidSpec, err.Error())
		return d
	}
	removeCondition(st, v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, ReasonInvalidSpec)

	budget := burst
	if budget <= 0 {
		budget = len(vmis) + Replicas(rs)
	}
	take := func(n int) int {
		n = min(n, budget)
		budget -= n
		return n
	}

	// Finished VMIs go first: each is replaced, and a finished VMI holds no capacity.
	n := take(len(final))
	d.Delete = append(d.Delete, final[:n]...)
	d.Capped = n < len(final)

	switch diff := Replicas(rs) - len(active); {
	case diff > 0:
		d.Create = take(diff)
		d.Capped = d.Capped || d.Create < diff
	case diff < 0:
		victims := scaleDownOrder(active)
		n := take(-diff)
		d.Delete = append(d.Delete, victims[:n]...)
		d.Capped = d.Capped || n < -diff
	}
	return d
}

// scaleDownOrder sorts VMIs by how little is lost deleting them: not yet running before running,
// not ready before ready, then newest first (as ReplicaSets do).
func scaleDownOrder(vmis []*v1alpha1.VirtualMachineInstance) []*v1alpha1.VirtualMachineInstance {
	out := append([]*v1alpha1.VirtualMachineInstance(nil), vmis...)
	rank := func(v *v1alpha1.VirtualMachineInstance) int {
		switch {
		case v.Status.Phase != v1alpha1.Running:
			return 0
		case !isReady(v):
			return 1
		default:
			return 2
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i]), rank(out[j])
		if ri != rj {
			return ri < rj
		}
		ti, tj := out[i].CreationTimestamp, out[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return tj.Before(&ti)
		}
		return out[i].Name > out[j].Name
	})
	return out
}

// setCondition sets a replica set condition (v1alpha1.SetCondition) observed at generation.
func setCondition(st *v1alpha1.VirtualMachineInstanceReplicaSetStatus, generation int64, now time.Time,
	t v1alpha1.VirtualMachineInstanceReplicaSetConditionType, status corev1.ConditionStatus, reason, message string) {
	st.Conditions = v1alpha1.SetCondition(st.Conditions, v1alpha1.VirtualMachineInstanceReplicaSetCondition{
		Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	}, metav1.NewTime(now))
}

// removeCondition drops the condition of type t; with reasons given, only when it carries one of them.
func removeCondition(st *v1alpha1.VirtualMachineInstanceReplicaSetStatus, t v1alpha1.VirtualMachineInstanceReplicaSetConditionType, reasons ...string) {
	st.Conditions = v1alpha1.RemoveCondition(st.Conditions, t, reasons...)
}
