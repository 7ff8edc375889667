package migration

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

const uid = "mig-uid"

type vmiOpt func(*v1alpha1.VirtualMachineInstance)

func vmi(opts ...vmiOpt) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: "node-a",
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}},
	}}
	for _, o := range opts {
		o(v)
	}
	return v
}

func phase(p v1alpha1.VirtualMachineInstancePhase) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = p }
}

func migratable(s corev1.ConditionStatus) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.Conditions[0].Status, v.Status.Conditions[0].Reason = s, v1alpha1.ReasonDisksNotLiveMigratable
	}
}

func noConditions(v *v1alpha1.VirtualMachineInstance) { v.Status.Conditions = nil }

func state(s v1alpha1.VirtualMachineInstanceMigrationState) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) { v.Status.MigrationState = &s }
}

func pod(node string, p corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: p}}
}

func TestNext(t *testing.T) {
	now := metav1.Now()
	terminating := pod("node-b", corev1.PodRunning)
	terminating.DeletionTimestamp = &now
	unschedulable := pod("", corev1.PodPending)
	unschedulable.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/2 nodes are available: 1 node(s) didn't match node affinity"}}
	for _, tc := range []struct {
		name   string
		obs    Observation
		want   v1alpha1.VirtualMachineInstanceMigrationPhase
		reason string
	}{
		{name: "new migration is accepted", obs: Observation{}, want: v1alpha1.MigrationPending},
		{name: "new migration is accepted before the VMI is looked at", obs: Observation{VMI: nil}, want: v1alpha1.MigrationPending},
		{name: "pending: VMI missing", obs: Observation{Phase: v1alpha1.MigrationPending}, want: v1alpha1.MigrationFailed, reason: ReasonVMINotFound},
		{name: "pending: VMI not running", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(phase(v1alpha1.Scheduled)), SourcePodFound: true}, want: v1alpha1.MigrationFailed, reason: ReasonVMINotRunning},
		{name: "pending: VMI not live migratable", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(migratable(corev1.ConditionFalse)), SourcePodFound: true}, want: v1alpha1.MigrationFailed, reason: ReasonNotLiveMigratable},
		{name: "pending: VMI without LiveMigratable condition", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(noConditions), SourcePodFound: true}, want: v1alpha1.MigrationFailed, reason: ReasonNotLiveMigratable},
		{name: "pending: another migration open", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "other"})), SourcePodFound: true, MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: ReasonMigrationInProgress},
		{name: "pending: earlier migration finished", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "other", Completed: true})), SourcePodFound: true, MigrationUID: uid}, want: v1alpha1.MigrationScheduling},
		{name: "pending: no source pod", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi()}, want: v1alpha1.MigrationFailed, reason: ReasonSourcePodNotFound},
		{name: "pending: all good", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(), SourcePodFound: true}, want: v1alpha1.MigrationScheduling},
		{name: "pending: held by a limit", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(), SourcePodFound: true, Throttled: "5 migrations run"}, want: v1alpha1.MigrationPending, reason: ReasonThrottled},
		{name: "pending: a limit does not hold a migration that cannot run", obs: Observation{Phase: v1alpha1.MigrationPending, VMI: vmi(migratable(corev1.ConditionFalse)), SourcePodFound: true, Throttled: "5 migrations run"}, want: v1alpha1.MigrationFailed, reason: ReasonNotLiveMigratable},
		{name: "scheduling: pod not yet created", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi()}, want: v1alpha1.MigrationScheduling},
		{name: "scheduling: pod pending", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("", corev1.PodPending)}, want: v1alpha1.MigrationScheduling},
		{name: "scheduling: pod bound, not running", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodPending)}, want: v1alpha1.MigrationScheduling},
		{name: "scheduling: pod unschedulable for too long", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: unschedulable, Scheduling: TargetPodPendingTimeout + time.Second}, want: v1alpha1.MigrationFailed, reason: ReasonTargetPodUnschedulable},
		{name: "scheduling: pod unschedulable for a while", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: unschedulable, Scheduling: time.Minute}, want: v1alpha1.MigrationScheduling},
		{name: "scheduling: pod running", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning)}, want: v1alpha1.MigrationTargetReady},
		{name: "scheduling: pod gone", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true}, want: v1alpha1.MigrationFailed, reason: ReasonTargetPodFailed},
		{name: "scheduling: pod failed", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodFailed)}, want: v1alpha1.MigrationFailed, reason: ReasonTargetPodFailed},
		{name: "scheduling: VMI stopped", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(phase(v1alpha1.Succeeded)), TargetPodCreated: true, TargetPod: pod("", corev1.PodPending)}, want: v1alpha1.MigrationFailed, reason: ReasonVMINotRunning},
		{name: "scheduling: VMI deleted", obs: Observation{Phase: v1alpha1.MigrationScheduling, TargetPodCreated: true, TargetPod: pod("", corev1.PodPending)}, want: v1alpha1.MigrationFailed, reason: ReasonVMINotFound},
		{name: "scheduling: another migration handed off first", obs: Observation{Phase: v1alpha1.MigrationScheduling, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "other"})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: ReasonMigrationInProgress},
		{name: "target ready: another migration handed off first", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "other"})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: ReasonMigrationInProgress},
		{name: "target ready: waiting for the node side", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationTargetReady},
		{name: "target ready: the node side never started", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid, WaitingForNode: NodeStartTimeout + time.Second}, want: v1alpha1.MigrationFailed, reason: ReasonNodeStartTimeout},
		{name: "target ready: the node side started just in time", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, StartTimestamp: &now})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid, WaitingForNode: NodeStartTimeout + time.Second}, want: v1alpha1.MigrationRunning},
		{name: "target ready: before the hand-off", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationTargetReady},
		{name: "target ready: node side started", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, StartTimestamp: &now})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationRunning},
		{name: "target ready: target pod terminating", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi(), TargetPodCreated: true, TargetPod: terminating, MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: ReasonTargetPodFailed},
		{name: "target ready: no target recorded", obs: Observation{Phase: v1alpha1.MigrationTargetReady, VMI: vmi()}, want: v1alpha1.MigrationFailed, reason: ReasonTargetPodFailed},
		{name: "running: in progress", obs: Observation{Phase: v1alpha1.MigrationRunning, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, StartTimestamp: &now})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationRunning},
		{name: "running: node side completed", obs: Observation{Phase: v1alpha1.MigrationRunning, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, Completed: true})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationSucceeded},
		{name: "running: node side failed", obs: Observation{Phase: v1alpha1.MigrationRunning, VMI: vmi(state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, Failed: true, FailureReason: "copy failed"})), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: v1alpha1.ReasonMigrationFailed},
		{name: "running: state cleared by someone", obs: Observation{Phase: v1alpha1.MigrationRunning, VMI: vmi(), TargetPodCreated: true, TargetPod: pod("node-b", corev1.PodRunning), MigrationUID: uid}, want: v1alpha1.MigrationFailed, reason: v1alpha1.ReasonMigrationFailed},
		{name: "running: completed wins over the source pod's VMI phase", obs: Observation{Phase: v1alpha1.MigrationRunning, VMI: vmi(phase(v1alpha1.Scheduling), state(v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, Completed: true})), TargetPodCreated: true, MigrationUID: uid}, want: v1alpha1.MigrationSucceeded},
		{name: "succeeded is final", obs: Observation{Phase: v1alpha1.MigrationSucceeded}, want: v1alpha1.MigrationSucceeded},
		{name: "failed is final", obs: Observation{Phase: v1alpha1.MigrationFailed, VMI: vmi(), SourcePodFound: true}, want: v1alpha1.MigrationFailed},
		{name: "scheduled (KubeVirt phase) counts as scheduling", obs: Observation{Phase: v1alpha1.MigrationScheduled, VMI: vmi()}, want: v1alpha1.MigrationScheduling},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Next(tc.obs)
			if got.Phase != tc.want || got.Reason != tc.reason {
				t.Fatalf("Next = %s (%s: %s), want %s (%s)", got.Phase, got.Reason, got.Message, tc.want, tc.reason)
			}
			if got.Phase == v1alpha1.MigrationFailed && tc.obs.Phase != v1alpha1.MigrationFailed && got.Message == "" {
				t.Errorf("failure without a message")
			}
		})
	}
}
