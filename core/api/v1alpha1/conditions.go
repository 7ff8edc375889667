package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SetInstanceCondition sets c in conds, replacing the condition of its type: the transition
// time becomes now when the status changes and is kept otherwise; the probe time is kept, and
// so is the observed generation when c carries none. Both writers of VMI status (the VMI
// controller and the node handler) use it, so a condition means the same from either.
func SetInstanceCondition(conds []VirtualMachineInstanceCondition, c VirtualMachineInstanceCondition, now metav1.Time) []VirtualMachineInstanceCondition {
	i := slices.IndexFunc(conds, func(o VirtualMachineInstanceCondition) bool { return o.Type == c.Type })
	if i < 0 {
		c.LastTransitionTime = now
		return append(conds, c)
	}
	c.LastTransitionTime = conds[i].LastTransitionTime
	if conds[i].Status != c.Status {
		c.LastTransitionTime = now
	}
	c.LastProbeTime = conds[i].LastProbeTime
	if c.ObservedGeneration == 0 {
		c.ObservedGeneration = conds[i].ObservedGeneration
	}
	conds[i] = c
	return conds
}

// InstanceCondition returns the condition of type t in conds, or nil.
func InstanceCondition(conds []VirtualMachineInstanceCondition, t VirtualMachineInstanceConditionType) *VirtualMachineInstanceCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
