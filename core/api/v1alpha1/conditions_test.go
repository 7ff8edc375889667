package v1alpha1

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSetInstanceCondition(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	conds := SetInstanceCondition(nil, VirtualMachineInstanceCondition{Type: VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: "A", ObservedGeneration: 3}, t0)
	conds = SetInstanceCondition(conds, VirtualMachineInstanceCondition{Type: VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: "B"}, t1)
	if c := conds[0]; !c.LastTransitionTime.Equal(&t0) || c.Reason != "B" || c.ObservedGeneration != 3 {
		t.Errorf("same status: %+v, want transition time t0, reason B, generation 3 kept", c)
	}
	conds = SetInstanceCondition(conds, VirtualMachineInstanceCondition{Type: VirtualMachineInstanceReady, Status: corev1.ConditionTrue, ObservedGeneration: 4}, t1)
	if c := conds[0]; !c.LastTransitionTime.Equal(&t1) || len(conds) != 1 || c.ObservedGeneration != 4 {
		t.Errorf("new status: %+v, want transition time t1, generation 4", conds)
	}
	conds = SetInstanceCondition(conds, VirtualMachineInstanceCondition{Type: VirtualMachineInstancePaused, Status: corev1.ConditionTrue}, t1)
	if len(conds) != 2 || InstanceCondition(conds, VirtualMachineInstancePaused) == nil || InstanceCondition(conds, "Other") != nil {
		t.Errorf("conditions %+v", conds)
	}
}
