package cluster

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func probeVMI(liveness, readiness *v1alpha1.Probe, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns"},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{LivenessProbe: liveness, ReadinessProbe: readiness},
		Status:     v1alpha1.VirtualMachineInstanceStatus{Phase: phase},
	}
}

func launcherPodReady(ready corev1.ConditionStatus, message string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher", Namespace: "ns", UID: "pod-uid"}}
	if ready != "" {
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, Reason: "ContainersNotReady", Message: message}}
	}
	return pod
}

func statusWithReady(phase v1alpha1.VirtualMachineInstancePhase, ready corev1.ConditionStatus, reason string) v1alpha1.VirtualMachineInstanceStatus {
	return v1alpha1.VirtualMachineInstanceStatus{Phase: phase, Reason: reason, Conditions: []v1alpha1.VirtualMachineInstanceCondition{{
		Type: v1alpha1.VirtualMachineInstanceReady, Status: ready,
	}}}
}

func TestWithProbes(t *testing.T) {
	http80 := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(80)}}}
	tcp1 := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(1)}}}
	const killed = "the liveness probe (tcpSocket port 1) failed: the kubelet stopped the compute container of launcher pod launcher"
	now := metav1.NewTime(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC))
	tests := []struct {
		name       string
		vmi        *v1alpha1.VirtualMachineInstance
		pod        *corev1.Pod
		liveness   string
		node       v1alpha1.VirtualMachineInstanceStatus
		wantReady  corev1.ConditionStatus
		wantCond   string // Ready's reason
		wantMsg    string // substring of Ready's message
		wantReason string // status.reason
	}{
		{name: "no probe: Ready as the handler says, pod not ready",
			vmi: probeVMI(nil, nil, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionFalse, ""),
			node: statusWithReady(v1alpha1.Running, corev1.ConditionTrue, ""), wantReady: corev1.ConditionTrue},
		{name: "readiness probe, pod Ready",
			vmi: probeVMI(nil, http80, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionTrue, ""),
			node: statusWithReady(v1alpha1.Running, corev1.ConditionTrue, ""), wantReady: corev1.ConditionTrue},
		{name: "readiness probe, pod not Ready",
			vmi: probeVMI(nil, http80, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionFalse, "containers with unready status: [compute]"),
			node:      statusWithReady(v1alpha1.Running, corev1.ConditionTrue, ""),
			wantReady: corev1.ConditionFalse, wantCond: v1alpha1.ReasonReadinessProbeFailed,
			wantMsg: "the readiness probe (httpGet port 80 path /) of launcher pod launcher has not succeeded: containers with unready status: [compute]"},
		{name: "readiness probe, pod has no Ready condition yet",
			vmi: probeVMI(nil, http80, v1alpha1.Running), pod: launcherPodReady("", ""),
			node:      statusWithReady(v1alpha1.Running, corev1.ConditionTrue, ""),
			wantReady: corev1.ConditionFalse, wantCond: v1alpha1.ReasonReadinessProbeFailed, wantMsg: "has not succeeded"},
		{name: "readiness probe, guest not running: the handler's Ready stands",
			vmi: probeVMI(nil, http80, v1alpha1.Scheduled), pod: launcherPodReady(corev1.ConditionFalse, ""),
			node:      v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Scheduled, Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonGuestNotRunning}}},
			wantReady: corev1.ConditionFalse, wantCond: v1alpha1.ReasonGuestNotRunning},
		{name: "liveness failure ends the VMI naming the probe",
			vmi: probeVMI(tcp1, nil, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionFalse, ""), liveness: killed,
			node:      statusWithReady(v1alpha1.Failed, corev1.ConditionFalse, "ProcessExited"),
			wantReady: corev1.ConditionFalse, wantCond: v1alpha1.ReasonLivenessProbeFailed, wantMsg: killed, wantReason: v1alpha1.ReasonLivenessProbeFailed},
		{name: "no liveness failure: the handler's reason stands",
			vmi: probeVMI(tcp1, nil, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionTrue, ""),
			node:      statusWithReady(v1alpha1.Failed, corev1.ConditionFalse, "ProcessExited"),
			wantReady: corev1.ConditionFalse, wantReason: "ProcessExited"},
		{name: "a final VMI keeps its reason",
			vmi: probeVMI(tcp1, nil, v1alpha1.Failed), pod: launcherPodReady(corev1.ConditionFalse, ""), liveness: killed,
			node:      statusWithReady(v1alpha1.Failed, corev1.ConditionFalse, "ProcessExited"),
			wantReady: corev1.ConditionFalse, wantReason: "ProcessExited"},
		{name: "still running: a liveness kill under way does not end it",
			vmi: probeVMI(tcp1, nil, v1alpha1.Running), pod: launcherPodReady(corev1.ConditionTrue, ""), liveness: killed,
			node: statusWithReady(v1alpha1.Running, corev1.ConditionTrue, ""), wantReady: corev1.ConditionTrue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.node.DeepCopy()
			st := withProbes(tt.vmi, tt.pod, tt.liveness, tt.node, now)
			c := v1alpha1.InstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceReady)
			if c == nil || c.Status != tt.wantReady {
				t.Fatalf("Ready = %+v, want %s", c, tt.wantReady)
			}
			if tt.wantCond != "" && c.Reason != tt.wantCond {
				t.Errorf("Ready reason = %q, want %q", c.Reason, tt.wantCond)
			}
			if !strings.Contains(c.Message, tt.wantMsg) {
				t.Errorf("Ready message = %q, want it to contain %q", c.Message, tt.wantMsg)
			}
			if st.Reason != tt.wantReason {
				t.Errorf("reason = %q, want %q", st.Reason, tt.wantReason)
			}
			if len(tt.node.Conditions) != len(before.Conditions) || tt.node.Conditions[0] != before.Conditions[0] {
				t.Error("withProbes changed its input")
			}
		})
	}
}

func TestLivenessKill(t *testing.T) {
	tcp1 := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(1)}}}
	pod := launcherPodReady(corev1.ConditionFalse, "")
	// of is an event of the compute container of the pod with uid.
	of := func(uid types.UID, reason, message string) corev1.Event {
		e := corev1.Event{Reason: reason, Message: message}
		e.InvolvedObject.UID, e.InvolvedObject.FieldPath = uid, "spec.containers{compute}"
		return e
	}
	unhealthy := of("pod-uid", "Unhealthy", "Liveness probe failed: dial tcp 10.0.0.5:1: connect: connection refused")
	kill := of("pod-uid", "Killing", "Container compute failed liveness probe, will be restarted")
	tests := []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		events []corev1.Event
		want   string
	}{
		{name: "killed for the probe, with the kubelet's detail", vmi: probeVMI(tcp1, nil, v1alpha1.Running), events: []corev1.Event{unhealthy, kill},
			want: "the liveness probe (tcpSocket port 1) failed: the kubelet stopped the compute container of launcher pod launcher (Liveness probe failed: dial tcp 10.0.0.5:1: connect: connection refused)"},
		{name: "killed, no detail", vmi: probeVMI(tcp1, nil, v1alpha1.Running), events: []corev1.Event{kill},
			want: "the liveness probe (tcpSocket port 1) failed: the kubelet stopped the compute container of launcher pod launcher"},
		{name: "unhealthy but not killed (yet)", vmi: probeVMI(tcp1, nil, v1alpha1.Running), events: []corev1.Event{unhealthy}},
		{name: "stopped for another reason", vmi: probeVMI(tcp1, nil, v1alpha1.Running), events: []corev1.Event{of("pod-uid", "Killing", "Stopping container compute")}},
		{name: "another pod's kill", vmi: probeVMI(tcp1, nil, v1alpha1.Running), events: []corev1.Event{of("other-pod", "Killing", "Container compute failed liveness probe")}},
		{name: "no liveness probe", vmi: probeVMI(nil, nil, v1alpha1.Running), events: []corev1.Event{kill}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := livenessKill(tt.vmi, pod, tt.events); got != tt.want {
				t.Errorf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestWithProbesKeepsTheStoredTransition checks that a readiness probe that keeps failing
// yields the same status on every sync, so that the handler does not write it again: the
// handler's own record says Ready=True, the stored VMI already says why not.
func TestWithProbesKeepsTheStoredTransition(t *testing.T) {
	http80 := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(80)}}}
	vmi := probeVMI(nil, http80, v1alpha1.Running)
	pod := launcherPodReady(corev1.ConditionFalse, "containers with unready status: [compute]")
	t0 := metav1.NewTime(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC))
	node := statusWithReady(v1alpha1.Running, corev1.ConditionTrue, "")
	node.Conditions[0].LastTransitionTime = t0

	first := withProbes(vmi, pod, "", node, metav1.NewTime(t0.Add(time.Minute)))
	vmi.Status = first
	second := withProbes(vmi, pod, "", node, metav1.NewTime(t0.Add(time.Hour)))
	a := v1alpha1.InstanceCondition(first.Conditions, v1alpha1.VirtualMachineInstanceReady)
	b := v1alpha1.InstanceCondition(second.Conditions, v1alpha1.VirtualMachineInstanceReady)
	if !a.LastTransitionTime.Equal(&b.LastTransitionTime) || *a != *b {
		t.Errorf("second sync changed Ready:\n first %+v\nsecond %+v", a, b)
	}
	if want := t0.Add(time.Minute); !a.LastTransitionTime.Time.Equal(want) {
		t.Errorf("transition at %v, want %v (when it became False)", a.LastTransitionTime, want)
	}
}
