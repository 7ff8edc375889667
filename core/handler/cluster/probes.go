package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// withProbes returns the status node the handler derived for vmi with what the kubelet's probes
// of the launcher pod's compute container say. It is a pure function:
//
//   - readinessProbe: Ready=True stands only while the pod is Ready; otherwise Ready=False with
//     reason ReadinessProbeFailed and a message naming the probe. Without a readiness probe,
//     and while the guest is not running (Ready already False), node is unchanged;
//   - livenessProbe: a VMI the handler newly ends Failed (the API's phase not final yet) while
//     the kubelet has stopped the compute container for its liveness probe (livenessFailure, ""
//     when it has not) ends with reason LivenessProbeFailed and that in its Ready message.
func withProbes(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, livenessFailure string, node v1alpha1.VirtualMachineInstanceStatus, now metav1.Time) v1alpha1.VirtualMachineInstanceStatus {
	st := *node.DeepCopy()
	ready := v1alpha1.InstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceReady)
	if p := vmi.Spec.ReadinessProbe; p != nil && pod != nil && ready != nil && ready.Status == corev1.ConditionTrue {
		if c := podCondition(pod, corev1.PodReady); c == nil || c.Status != corev1.ConditionTrue {
			msg := fmt.Sprintf("the readiness probe (%s) of launcher pod %s has not succeeded", p, pod.Name)
			if c != nil && c.Message != "" {
				msg += ": " + c.Message
			}
			setReady(&st, vmi, v1alpha1.ReasonReadinessProbeFailed, msg, now)
		}
	}
	if vmi.Spec.LivenessProbe != nil && livenessFailure != "" && st.Phase == v1alpha1.Failed && !vmi.Status.Phase.IsFinal() {
		st.Reason = v1alpha1.ReasonLivenessProbeFailed
		setReady(&st, vmi, v1alpha1.ReasonLivenessProbeFailed, livenessFailure, now)
	}
	return st
}

// setReady sets st's Ready condition False with reason and message. The handler derives its
// Ready from its own record, which does not have this one, so the transition time is the stored
// VMI's while that already says the same: a status that does not change is not written again.
func setReady(st *v1alpha1.VirtualMachineInstanceStatus, vmi *v1alpha1.VirtualMachineInstance, reason, message string, now metav1.Time) {
	c := v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse,
		Reason: reason, Message: message, LastTransitionTime: now,
	}
	if old := v1alpha1.InstanceCondition(st.Conditions, c.Type); old != nil {
		c.LastProbeTime, c.ObservedGeneration = old.LastProbeTime, old.ObservedGeneration
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
	}
	if stored := v1alpha1.InstanceCondition(vmi.Status.Conditions, c.Type); stored != nil && stored.Status == c.Status {
		c.LastTransitionTime = stored.LastTransitionTime
	}
	st.Conditions = slices.DeleteFunc(st.Conditions, func(o v1alpha1.VirtualMachineInstanceCondition) bool { return o.Type == c.Type })
	st.Conditions = append([]v1alpha1.VirtualMachineInstanceCondition{c}, st.Conditions...)
}

// livenessKill says, from the events of the VMI's launcher pod, whether the kubelet stopped
// the compute container for a failed liveness probe: a message naming the probe and the
// kubelet's last word on it, "" when it did not. The kubelet records the kill (Killing, "failed
// liveness probe") before it signals the container, so the event is there by the time the
// guest is gone.
func livenessKill(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, events []corev1.Event) string {
	if vmi.Spec.LivenessProbe == nil || pod == nil {
		return ""
	}
	container := fmt.Sprintf("spec.containers{%s}", layout.ComputeContainer)
	killed, detail := false, ""
	for _, e := range events {
		if e.InvolvedObject.UID != pod.UID || e.InvolvedObject.FieldPath != container {
			continue
		}
		switch {
		case e.Reason == "Killing" && strings.Contains(e.Message, "failed liveness probe"):
			killed = true
		case e.Reason == "Unhealthy" && strings.HasPrefix(e.Message, "Liveness probe failed"):
			detail = e.Message
		}
	}
	if !killed {
		return ""
	}
	msg := fmt.Sprintf("the liveness probe (%s) failed: the kubelet stopped the compute container of launcher pod %s", vmi.Spec.LivenessProbe, pod.Name)
	if detail != "" {
		msg += " (" + detail + ")"
	}
	return msg
}

// livenessFailure is livenessKill of the launcher pod's events, read from the API server (not
// cached: the agent watches no events), only for a VMI with a liveness probe whose status the
// handler is about to end Failed.
func (a *Agent) livenessFailure(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, node v1alpha1.VirtualMachineInstanceStatus) string {
	if vmi.Spec.LivenessProbe == nil || pod == nil || node.Phase != v1alpha1.Failed || vmi.Status.Phase.IsFinal() {
		return ""
	}
	var events corev1.EventList
	if err := a.reader.List(ctx, &events, client.InNamespace(pod.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID))}); err != nil {
		a.log.Error(err, "list the launcher pod's events", "pod", pod.Name)
		return ""
	}
	return livenessKill(vmi, pod, events.Items)
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// probed is withProbes of the status the handler derived, with the
// launcher pod's events read when they may tell a liveness probe's failure.
func (a *Agent) probed(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, node v1alpha1.VirtualMachineInstanceStatus) v1alpha1.VirtualMachineInstanceStatus {
	return withProbes(vmi, pod, a.livenessFailure(ctx, vmi, pod, node), node, metav1.Now())
}
