package v1alpha1

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The condition types of VMs, VMIs, VMI replica sets and migrations have the same fields and
// differ only in the type of Type (as KubeVirt's do). SetCondition, FindCondition and
// RemoveCondition work on any of them, so that a condition's transition time, probe time and
// observed generation follow one rule whoever sets it.

// conditionFields points at the fields every condition type has.
type conditionFields struct {
	typ                string
	status             corev1.ConditionStatus
	reason             string
	probe, transition  *metav1.Time
	observedGeneration *int64
}

// conditionPtr is a pointer to one of the condition types.
type conditionPtr[C any] interface {
	*C
	fields() conditionFields
}

func (c *VirtualMachineCondition) fields() conditionFields {
	return conditionFields{string(c.Type), c.Status, c.Reason, &c.LastProbeTime, &c.LastTransitionTime, &c.ObservedGeneration}
}

func (c *VirtualMachineInstanceCondition) fields() conditionFields {
	return conditionFields{string(c.Type), c.Status, c.Reason, &c.LastProbeTime, &c.LastTransitionTime, &c.ObservedGeneration}
}

func (c *VirtualMachineInstanceReplicaSetCondition) fields() conditionFields {
	return conditionFields{string(c.Type), c.Status, c.Reason, &c.LastProbeTime, &c.LastTransitionTime, &c.ObservedGeneration}
}

func (c *VirtualMachineInstanceMigrationCondition) fields() conditionFields {
	return conditionFields{string(c.Type), c.Status, c.Reason, &c.LastProbeTime, &c.LastTransitionTime, &c.ObservedGeneration}
}

// SetCondition sets c in conds, replacing the condition of its type, and returns conds: the
// transition time becomes now when the status changes (or the condition is new) and is kept
// otherwise; the probe time is kept, and so is the observed generation when c carries none.
func SetCondition[C any, P conditionPtr[C]](conds []C, c C, now metav1.Time) []C {
	nf := P(&c).fields()
	i := slices.IndexFunc(conds, func(o C) bool { return P(&o).fields().typ == nf.typ })
	if i < 0 {
		*nf.transition = now
		return append(conds, c)
	}
	of := P(&conds[i]).fields()
	*nf.transition = *of.transition
	if of.status != nf.status {
		*nf.transition = now
	}
	*nf.probe = *of.probe
	if *nf.observedGeneration == 0 {
		*nf.observedGeneration = *of.observedGeneration
	}
	conds[i] = c
	return conds
}

// FindCondition returns the condition of type t in conds, or nil.
func FindCondition[C any, P conditionPtr[C], T ~string](conds []C, t T) *C {
	for i := range conds {
		if P(&conds[i]).fields().typ == string(t) {
			return &conds[i]
		}
	}
	return nil
}

// RemoveCondition drops the condition of type t from conds (with reasons given, only when it
// carries one of them) and returns the rest, nil when none is left.
func RemoveCondition[C any, P conditionPtr[C], T ~string](conds []C, t T, reasons ...string) []C {
	var out []C
	for i := range conds {
		f := P(&conds[i]).fields()
		if f.typ == string(t) && (len(reasons) == 0 || slices.Contains(reasons, f.reason)) {
			continue
		}
		out = append(out, conds[i])
	}
	return out
}

// SetInstanceCondition is SetCondition for VMI conditions.
func SetInstanceCondition(conds []VirtualMachineInstanceCondition, c VirtualMachineInstanceCondition, now metav1.Time) []VirtualMachineInstanceCondition {
	return SetCondition(conds, c, now)
}

// InstanceCondition is FindCondition for VMI conditions.
func InstanceCondition(conds []VirtualMachineInstanceCondition, t VirtualMachineInstanceConditionType) *VirtualMachineInstanceCondition {
	return FindCondition(conds, t)
}
