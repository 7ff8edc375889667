package v1alpha1

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCanMoveTo(t *testing.T) {
	for _, tt := range []struct {
		from, to VirtualMachineInstancePhase
		want     bool
	}{
		{VMIPhaseUnset, Running, true},
		{Pending, Scheduling, true},
		{Scheduling, Running, true},
		{Scheduled, Scheduled, true},
		{Running, Scheduled, false},
		{Scheduling, Pending, false},
		{Pending, Failed, true},
		{Running, Succeeded, true},
		{Running, Unknown, true},
		{Unknown, Running, true},
		{Failed, Failed, true},
		{Failed, Succeeded, false},
		{Succeeded, Running, false},
		{Running, VMIPhaseUnset, false},
	} {
		if got := tt.from.CanMoveTo(tt.to); got != tt.want {
			t.Errorf("%q.CanMoveTo(%q) = %v, want %v", tt.from, tt.to, got, tt.want)
		}
	}
	if Running.IsFinal() || !Failed.IsFinal() || !Succeeded.IsFinal() {
		t.Error("IsFinal")
	}
}

func TestHandlerFieldManager(t *testing.T) {
	if got := HandlerFieldManager("node-1"); got != "kubevisor-handler/node-1" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("n", 253)
	if got := HandlerFieldManager(long); len(got) > maxFieldManager || got == HandlerFieldManager(long+"x") {
		t.Errorf("long node name: %q", got)
	}
}

func TestFieldManagers(t *testing.T) {
	vmi := &VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "a", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{},"f:reason":{}}}`)},
		{Manager: "b", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}},"f:status":{"f:interfaces":{}}}`)},
		{Manager: "c", FieldsV1: metav1.NewFieldsV1(`{"f:status":{".":{},"f:phase":{}}}`)},
		{Manager: "d"},
		{Manager: "e", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{"f:reason":{}},"k:{\"type\":\"Paused\"}":{}}}}`)},
		{Manager: "f", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"Paused\"}":{}}}}`)},
	}}}
	if got := FieldManagers(vmi, "f:status", "f:phase"); !cmp.Equal(got, []string{"a", "c"}) {
		t.Errorf("phase owners %v", got)
	}
	if HoldsLifecycle(vmi, "a") || HoldsLifecycle(vmi, "e") || !HoldsLifecycle(&VirtualMachineInstance{}, "a") {
		t.Error("HoldsLifecycle: the phase has two owners")
	}
	alone := &VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{ManagedFields: vmi.ManagedFields[:1]}}
	if !HoldsLifecycle(alone, "a") || HoldsLifecycle(alone, "b") {
		t.Error("HoldsLifecycle: a alone owns the phase")
	}
	for m, want := range map[string]bool{"a": true, "b": false, "c": true, "e": true, "f": false} {
		if SharesLifecycle(vmi, m) != want {
			t.Errorf("SharesLifecycle(%s) = %v", m, !want)
		}
	}
}

func TestStatusApply(t *testing.T) {
	vmi := &VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", ResourceVersion: "7"}}
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	st := LifecycleFields(VirtualMachineInstanceStatus{
		Phase: Running, NodeName: "n1", HypervisorClassName: "qemu",
		Conditions: []VirtualMachineInstanceCondition{
			{Type: VirtualMachineInstancePaused, Status: corev1.ConditionTrue},
			{Type: VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: t0},
		},
		PhaseTransitionTimestamps: []VirtualMachineInstancePhaseTransitionTimestamp{{Phase: Running, PhaseTransitionTimestamp: t0}},
	})
	u, err := StatusApply(vmi, &st, "7")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"apiVersion": "kubevisor.io/v1alpha1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm", "namespace": "ns", "resourceVersion": "7"},
		"status": map[string]any{
			"phase":                     "Running",
			"conditions":                []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:00Z"}},
			"phaseTransitionTimestamps": []any{map[string]any{"phase": "Running", "phaseTransitionTimestamp": "2026-11-29T10:00:00Z"}},
		},
	}
	if d := cmp.Diff(want, u.Object); d != "" {
		t.Errorf("apply body (-want +got):\n%s", d)
	}
	u, err = StatusApply(vmi, &VirtualMachineInstanceStatus{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["status"]; ok || u.Object["metadata"].(map[string]any)["resourceVersion"] != nil {
		t.Errorf("empty status: %v, want no status and no resourceVersion", u.Object)
	}
}
