package e2e

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// RequireTwoNodes counts the nodes new pods can run on: Ready, not cordoned, no NoSchedule or
// NoExecute taint (a PreferNoSchedule one does not keep them off).
func TestUnschedulable(t *testing.T) {
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	for _, c := range []struct {
		name string
		node corev1.Node
		want string
	}{
		{"ready", corev1.Node{Status: corev1.NodeStatus{Conditions: ready}}, ""},
		{"prefer-no-schedule", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: ready}}, ""},
		{"cordoned", corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}, Status: corev1.NodeStatus{Conditions: ready}}, "cordoned"},
		{"no-schedule", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: ready}}, "taint node.kubernetes.io/not-ready"},
		{"no-execute", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoExecute}}},
			Status: corev1.NodeStatus{Conditions: ready}}, "taint k"},
		{"not-ready", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}}, "not Ready"},
		{"no-ready-condition", corev1.Node{}, "not Ready"},
	} {
		if got := unschedulable(c.node); got != c.want {
			t.Errorf("%s: unschedulable = %q, want %q", c.name, got, c.want)
		}
	}
}
