package operator

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The reasons of a Kubevisor's conditions.
const (
	ReasonInstalled         = "Installed"
	ReasonRollingOut        = "RollingOut"
	ReasonApplying          = "Applying"
	ReasonApplyFailed       = "ApplyFailed"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonDriverInUse       = "DriverInUse"
	ReasonComponentNotReady = "ComponentNotReady"
	ReasonAnotherKubevisor  = "AnotherKubevisorIsActive"
	ReasonUninstallBlocked  = "UninstallBlocked"
	ReasonUninstalling      = "Uninstalling"
	ReasonNoInstall         = "NotInstalled"
	ReasonAsExpected        = "AsExpected"
)

// deploymentLine is the status line of a Deployment; pods are its pods, for the message.
func deploymentLine(d *appsv1.Deployment, pods []corev1.Pod) v1alpha1.KubevisorComponentStatus {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	line := v1alpha1.KubevisorComponentStatus{
		Name: d.Name, Kind: "Deployment", Desired: want,
		Updated: d.Status.UpdatedReplicas, Ready: d.Status.ReadyReplicas,
		Version: d.Spec.Template.Annotations[VersionAnnotation],
	}
	switch {
	case d.Status.ObservedGeneration < d.Generation:
		line.Message = "the deployment controller has not seen its latest spec"
	case d.Status.UpdatedReplicas < want:
		line.Message = fmt.Sprintf("%d of %d pods updated", d.Status.UpdatedReplicas, want)
	case d.Status.Replicas > d.Status.UpdatedReplicas:
		line.Message = fmt.Sprintf("%d old pods still running", d.Status.Replicas-d.Status.UpdatedReplicas)
	case d.Status.AvailableReplicas < want:
		line.Message = fmt.Sprintf("%d of %d pods available", d.Status.AvailableReplicas, want)
	}
	if line.Message != "" {
		line.Message = appendPodTrouble(line.Message, pods)
	}
	return line
}

// daemonSetLine is the status line of a DaemonSet; pods are its pods, for the message.
func daemonSetLine(ds *appsv1.DaemonSet, pods []corev1.Pod) v1alpha1.KubevisorComponentStatus {
	want := ds.Status.DesiredNumberScheduled
	line := v1alpha1.KubevisorComponentStatus{
		Name: ds.Name, Kind: "DaemonSet", Desired: want,
		Updated: ds.Status.UpdatedNumberScheduled, Ready: ds.Status.NumberReady,
		Version: ds.Spec.Template.Annotations[VersionAnnotation],
	}
	switch {
	case ds.Status.ObservedGeneration < ds.Generation:
		line.Message = "the daemon set controller has not seen its latest spec"
	case want == 0:
		line.Message = "no node to run on (check spec.workloads and the nodes' taints)"
	case ds.Status.UpdatedNumberScheduled < want:
		line.Message = fmt.Sprintf("%d of %d nodes updated", ds.Status.UpdatedNumberScheduled, want)
	case ds.Status.NumberAvailable < want:
		line.Message = fmt.Sprintf("%d of %d nodes available", ds.Status.NumberAvailable, want)
	}
	if line.Message != "" {
		line.Message = appendPodTrouble(line.Message, pods)
	}
	return line
}

// appendPodTrouble adds to msg why pods are not ready: a container waiting with a reason (an
// image that cannot be pulled, a crash loop), or a pod that cannot be scheduled.
func appendPodTrouble(msg string, pods []corev1.Pod) string {
	var trouble []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				trouble = append(trouble, fmt.Sprintf("pod %s: %s", p.Name, c.Message))
			}
		}
		statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, cs := range statuses {
			w := cs.State.Waiting
			if w == nil || w.Reason == "" || w.Reason == "PodInitializing" || w.Reason == "ContainerCreating" {
				continue
			}
			t := fmt.Sprintf("pod %s container %s: %s", p.Name, cs.Name, w.Reason)
			if w.Message != "" {
				t += ": " + w.Message
			}
			trouble = append(trouble, t)
		}
	}
	sort.Strings(trouble)
	if len(trouble) > 3 {
		trouble = append(trouble[:3], fmt.Sprintf("and %d more", len(trouble)-3))
	}
	if len(trouble) == 0 {
		return msg
	}
	return msg + "; " + strings.Join(trouble, "; ")
}

// lineReady reports whether a workload is rolled out at version: every pod updated and
// available.
func lineReady(l v1alpha1.KubevisorComponentStatus, version string) bool {
	return l.Message == "" && l.Version == version && l.Desired > 0
}

// setCondition sets a condition of kv's status, at the spec's generation.
func setCondition(kv *v1alpha1.Kubevisor, typ string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&kv.Status.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: kv.Generation,
	})
}

// notReady lists the lines that are not ready at version, for a message.
func notReady(lines []v1alpha1.KubevisorComponentStatus, version string) string {
	var out []string
	for _, l := range lines {
		if lineReady(l, version) {
			continue
		}
		msg := l.Message
		if msg == "" && l.Version != version {
			msg = fmt.Sprintf("at version %q", l.Version)
		}
		out = append(out, fmt.Sprintf("%s %s: %s", strings.ToLower(l.Kind), l.Name, msg))
	}
	return strings.Join(out, "; ")
}
