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

// TestConditionHelpersOnEveryKind: the same helpers serve the VM, replica set and migration
// conditions.
func TestConditionHelpersOnEveryKind(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	vm := SetCondition(nil, VirtualMachineCondition{Type: VirtualMachineFailure, Status: corev1.ConditionTrue, Reason: ReasonFailedCreate}, t0)
	vm = SetCondition(vm, VirtualMachineCondition{Type: VirtualMachineReady, Status: corev1.ConditionFalse}, t0)
	if c := FindCondition(vm, VirtualMachineFailure); c == nil || !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("VM conditions %+v", vm)
	}
	if vm = RemoveCondition(vm, VirtualMachineFailure, ReasonFailedDelete); len(vm) != 2 {
		t.Errorf("removed a condition of another reason: %+v", vm)
	}
	if vm = RemoveCondition(vm, VirtualMachineFailure, ReasonFailedCreate); len(vm) != 1 || vm[0].Type != VirtualMachineReady {
		t.Errorf("after removing Failure: %+v", vm)
	}
	if vm = RemoveCondition(vm, VirtualMachineReady); vm != nil {
		t.Errorf("after removing the last one: %#v, want nil", vm)
	}
	rs := SetCondition(nil, VirtualMachineInstanceReplicaSetCondition{Type: VirtualMachineInstanceReplicaSetReplicaPaused, Status: corev1.ConditionTrue}, t0)
	mig := SetCondition(nil, VirtualMachineInstanceMigrationCondition{Type: VirtualMachineInstanceMigrationAbortRequested, Status: corev1.ConditionTrue}, t0)
	if FindCondition(rs, VirtualMachineInstanceReplicaSetReplicaPaused) == nil || FindCondition(mig, VirtualMachineInstanceMigrationAbortRequested) == nil {
		t.Errorf("replica set %+v, migration %+v", rs, mig)
	}
}
