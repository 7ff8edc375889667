package vmi

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(t0.Add(time.Minute))
)

func vmiWith(phase v1alpha1.VirtualMachineInstancePhase, mut ...func(*v1alpha1.VirtualMachineInstanceStatus)) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", Generation: 3}}
	vmi.Status.Phase = phase
	for _, m := range mut {
		m(&vmi.Status)
	}
	return vmi
}

func created(s *v1alpha1.VirtualMachineInstanceStatus) { s.LauncherPodName = "launcher-1" }

func launcher(mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-1", Namespace: "ns"}}
	p.Status.Phase = corev1.PodPending
	for _, m := range mut {
		m(p)
	}
	return p
}

func bound(node string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.NodeName = node } }

func podPhase(ph corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = ph }
}

func withCond(c v1alpha1.VirtualMachineInstanceCondition) func(*v1alpha1.VirtualMachineInstanceStatus) {
	return func(s *v1alpha1.VirtualMachineInstanceStatus) { s.Conditions = append(s.Conditions, c) }
}

func TestDeriveStatus(t *testing.T) {
	type want struct {
		phase    v1alpha1.VirtualMachineInstancePhase
		reason   string
		nodeName string
		podName  string
		class    string
		driver   string
		// conds maps a condition type to "Status/Reason" with an optional "/message substring";
		// "-" means the condition must be absent.
		conds map[v1alpha1.VirtualMachineInstanceConditionType]string
		// newPhaseTimestamp says a transition timestamp (at t1) for phase was appended.
		newPhaseTimestamp bool
	}
	tests := []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		obs  observation
		want want
	}{
		{
			name: "no class: Pending with the reason",
			vmi:  vmiWith(""),
			obs:  observation{ClassProblem: &problem{v1alpha1.ReasonHypervisorClassNotFound, `HypervisorClass "fast" not found`}},
			want: want{phase: v1alpha1.Pending, newPhaseTimestamp: true, conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: `False/HypervisorClassNotFound/HypervisorClass "fast" not found`,
				v1alpha1.VirtualMachineInstanceReady:              "False/HypervisorClassNotFound",
			}},
		},
		{
			name: "several default classes",
			vmi:  vmiWith(v1alpha1.Pending),
			obs:  observation{ClassProblem: &problem{v1alpha1.ReasonMultipleDefaultHypervisorClasses, "several are default: a, b"}},
			want: want{phase: v1alpha1.Pending, conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: "False/MultipleDefaultHypervisorClasses/a, b",
			}},
		},
		{
			name: "pod could not be created",
			vmi:  vmiWith(v1alpha1.Pending),
			obs:  observation{ClassName: "qemu", CreateProblem: &problem{v1alpha1.ReasonFailedCreate, "create launcher pod: forbidden"}},
			want: want{phase: v1alpha1.Pending, class: "qemu", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: "False/FailedCreate/forbidden",
			}},
		},
		{
			name: "pod created: Scheduling, names recorded, LauncherPodCreated gone",
			vmi: vmiWith(v1alpha1.Pending, withCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: v1alpha1.VirtualMachineInstanceLauncherPodCreated, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonHypervisorClassNotFound,
			})),
			obs: observation{ClassName: "qemu", Driver: "qmp", Pod: launcher()},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", class: "qemu", driver: "qmp", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
					v1alpha1.VirtualMachineInstanceLauncherPodCreated: "-",
					v1alpha1.VirtualMachineInstanceReady:              "False/GuestNotRunning/launcher-1",
				}},
		},
		{
			name: "pod made in a pass whose status write was lost: class and driver from the pod's labels",
			vmi:  vmiWith(v1alpha1.Pending),
			obs: observation{Pod: launcher(func(p *corev1.Pod) {
				p.Labels = map[string]string{v1alpha1.HypervisorClassLabel: "virt", v1alpha1.HypervisorDriverLabel: "libvirt"}
			})},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", class: "virt", driver: "libvirt", newPhaseTimestamp: true},
		},
		{
			name: "the handler's Synchronized condition is left as it is",
			vmi: vmiWith(v1alpha1.Scheduled, created, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.NodeName = "n1" }, withCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonSyncFailed,
			})),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodRunning))},
			want: want{phase: v1alpha1.Scheduled, podName: "launcher-1", nodeName: "n1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceSynchronized: "False/SyncFailed",
				v1alpha1.VirtualMachineInstanceReady:        "-",
			}},
		},
		{
			name: "unschedulable pod: its condition and the scheduler's message on the VMI",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs: observation{Pod: launcher(func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
					Message: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}}
			})},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				podScheduledCondition: "False/Unschedulable/didn't match Pod's node affinity",
			}},
		},
		{
			name: "pod bound, not running yet: still Scheduling, nodeName and PodScheduled=True wait for Scheduled (no write on the way)",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs: observation{Pod: launcher(bound("n1"), func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
					{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}}
			})},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: "False/GuestNotRunning",
				podScheduledCondition:                "-",
			}},
		},
		{
			name: "bound after Unschedulable: PodScheduled=True replaces the False at once",
			vmi: vmiWith(v1alpha1.Scheduling, created, withCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: podScheduledCondition, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			})),
			obs: observation{Pod: launcher(bound("n1"), func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
			})},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				podScheduledCondition: "True/",
			}},
		},
		{
			name: "pod running: Scheduled with nodeName and PodScheduled=True",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodRunning), func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
			})},
			want: want{phase: v1alpha1.Scheduled, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true, conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				podScheduledCondition:                "True/",
				v1alpha1.VirtualMachineInstanceReady: "-",
			}},
		},
		{
			name: "pod created, no conditions yet: the same Ready=False as a bound pod not running yet (no write on the way)",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs:  observation{Pod: launcher()},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: "False/GuestNotRunning/is not running yet",
			}},
		},
		{
			name: "a claim does not exist: Pending, no pod, LauncherPodCreated=False and Ready=False naming the claim and its volume",
			vmi:  vmiWith(v1alpha1.Pending),
			obs:  observation{ClaimProblem: &problem{v1alpha1.ReasonFailedPvcNotFound, "PersistentVolumeClaim ns/data (volume disk) does not exist"}},
			want: want{phase: v1alpha1.Pending, conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: "False/FailedPvcNotFound/PersistentVolumeClaim ns/data (volume disk) does not exist; the launcher pod is created once it exists",
				v1alpha1.VirtualMachineInstanceReady:              "False/FailedPvcNotFound/ns/data (volume disk) does not exist",
			}},
		},
		{
			name: "a claim deleted after the pod was created: Ready=False names it, LauncherPodCreated stays gone",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs:  observation{Pod: launcher(), ClaimProblem: &problem{v1alpha1.ReasonFailedPvcNotFound, "PersistentVolumeClaim ns/data (volume disk) does not exist"}},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: "-",
				v1alpha1.VirtualMachineInstanceReady:              "False/FailedPvcNotFound/ns/data (volume disk) does not exist",
			}},
		},
		{
			name: "a claim not bound: the pod is created (binding may wait for it), Ready=False WaitingForVolumeBinding naming the claim",
			vmi:  vmiWith(v1alpha1.Pending),
			obs: observation{ClassName: "qemu", Pod: launcher(),
				ClaimProblem: &problem{v1alpha1.ReasonWaitingForVolumeBinding, "PersistentVolumeClaim ns/data (volume disk) is not bound to a volume yet (phase Pending)"}},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", class: "qemu", newPhaseTimestamp: true, conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceLauncherPodCreated: "-",
				v1alpha1.VirtualMachineInstanceReady:              "False/WaitingForVolumeBinding/ns/data (volume disk) is not bound to a volume yet",
			}},
		},
		{
			name: "a claim not bound and the scheduler's complaint: both on the VMI",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs: observation{Pod: launcher(func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
					Message: "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."}}
			}), ClaimProblem: &problem{v1alpha1.ReasonWaitingForVolumeBinding, "PersistentVolumeClaim ns/data (volume disk) is not bound"}},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				podScheduledCondition:                "False/Unschedulable/unbound immediate PersistentVolumeClaims",
				v1alpha1.VirtualMachineInstanceReady: "False/WaitingForVolumeBinding/ns/data (volume disk)",
			}},
		},
		{
			name: "pod running: Scheduled, a claim's problem no longer looked at",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs:  observation{Pod: launcher(bound("n1"), podPhase(corev1.PodRunning)), ClaimProblem: &problem{v1alpha1.ReasonWaitingForVolumeBinding, "x"}},
			want: want{phase: v1alpha1.Scheduled, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{v1alpha1.VirtualMachineInstanceReady: "-"}},
		},
		{
			name: "containerDisk image cannot be pulled: Ready=False with the kubelet's reason, the container, its volume, its image and message",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := vmiWith(v1alpha1.Scheduling, created)
				v.Spec.Volumes = []v1alpha1.Volume{{Name: "containerdisk", VolumeSource: v1alpha1.VolumeSource{
					ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/missing:v1"}}}}
				return v
			}(),
			obs: observation{Pod: launcher(bound("n1"), func(p *corev1.Pod) {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{
					{Name: "compute", Image: "kubevisor/kubevisor-launcher:dev", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
					{Name: "volume-containerdisk", Image: "example.com/missing:v1", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
						Reason: "ErrImagePull", Message: "failed to pull image \"example.com/missing:v1\": not found"}}},
				}
			})},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: `False/ErrImagePull/launcher pod launcher-1: container volume-containerdisk (containerDisk volume containerdisk, image example.com/missing:v1): ErrImagePull: failed to pull image "example.com/missing:v1": not found`,
			}},
		},
		{
			name: "image pull backing off, no image in the status: ImagePullBackOff naming the pod spec's image",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs: observation{Pod: launcher(bound("n1"), func(p *corev1.Pod) {
				p.Spec.Containers = []corev1.Container{{Name: "volume-root", Image: "example.com/gone:v2"}}
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "volume-root", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason: "ImagePullBackOff", Message: `Back-off pulling image "example.com/gone:v2"`}}}}
			}), ClaimProblem: &problem{v1alpha1.ReasonWaitingForVolumeBinding, "not this"}},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: `False/ImagePullBackOff/container volume-root (image example.com/gone:v2): ImagePullBackOff: Back-off pulling image`,
			}},
		},
		{
			name: "pod running: Scheduled, Ready left to the handler",
			vmi: vmiWith(v1alpha1.Scheduling, created, withCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonGuestNotRunning,
			})),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodRunning))},
			want: want{phase: v1alpha1.Scheduled, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{v1alpha1.VirtualMachineInstanceReady: "-"}},
		},
		{
			name: "Running stays Running; a migrated nodeName is not put back",
			vmi: vmiWith(v1alpha1.Running, created, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.NodeName = "n2" }, withCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue,
			})),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodRunning))},
			want: want{phase: v1alpha1.Running, podName: "launcher-1", nodeName: "n2", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: "True/",
			}},
		},
		{
			name: "pod failed: Failed, the reason names the pod and the exit",
			vmi:  vmiWith(v1alpha1.Running, created),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodFailed), func(p *corev1.Pod) {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "compute", State: corev1.ContainerState{
					Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"},
				}}}
			})},
			want: want{phase: v1alpha1.Failed, reason: v1alpha1.ReasonPodFailed, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
					v1alpha1.VirtualMachineInstanceReady: "False/PodFailed/launcher pod launcher-1 failed: container compute exited with code 2",
				}},
		},
		{
			name: "pod evicted: the pod's own reason",
			vmi:  vmiWith(v1alpha1.Scheduled, created),
			obs: observation{Pod: launcher(bound("n1"), podPhase(corev1.PodFailed), func(p *corev1.Pod) {
				p.Status.Reason, p.Status.Message = "Evicted", "The node was low on resource: memory."
			})},
			want: want{phase: v1alpha1.Failed, reason: v1alpha1.ReasonPodFailed, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
					v1alpha1.VirtualMachineInstanceReady: "False/PodFailed/failed: Evicted The node was low",
				}},
		},
		{
			name: "pod completed before the guest ran: Failed",
			vmi:  vmiWith(v1alpha1.Scheduled, created),
			obs:  observation{Pod: launcher(bound("n1"), podPhase(corev1.PodSucceeded))},
			want: want{phase: v1alpha1.Failed, reason: v1alpha1.ReasonPodFailed, podName: "launcher-1", nodeName: "n1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
					v1alpha1.VirtualMachineInstanceReady: "False/PodFailed/completed before the guest ran",
				}},
		},
		{
			name: "pod completed after the guest ran: the handler decides",
			vmi:  vmiWith(v1alpha1.Running, created),
			obs:  observation{Pod: launcher(bound("n1"), podPhase(corev1.PodSucceeded))},
			want: want{phase: v1alpha1.Running, podName: "launcher-1", nodeName: "n1"},
		},
		{
			name: "pod gone: Failed, PodNotExists naming the pod",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs:  observation{PodGone: true},
			want: want{phase: v1alpha1.Failed, reason: v1alpha1.ReasonPodNotExists, podName: "launcher-1", newPhaseTimestamp: true,
				conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
					v1alpha1.VirtualMachineInstanceReady: "False/PodNotExists/launcher pod launcher-1 was deleted",
				}},
		},
		{
			name: "pod terminating while scheduling: phase kept, Ready says so",
			vmi:  vmiWith(v1alpha1.Scheduling, created),
			obs:  observation{Pod: launcher(func(p *corev1.Pod) { p.DeletionTimestamp = &t0 })},
			want: want{phase: v1alpha1.Scheduling, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: "False/PodTerminating",
			}},
		},
		{
			name: "final VMI: nothing changes",
			vmi:  vmiWith(v1alpha1.Succeeded, created),
			obs:  observation{PodGone: true},
			want: want{phase: v1alpha1.Succeeded, podName: "launcher-1", conds: map[v1alpha1.VirtualMachineInstanceConditionType]string{
				v1alpha1.VirtualMachineInstanceReady: "-",
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.vmi.DeepCopy()
			st := deriveStatus(tt.vmi, tt.obs, t1)
			if st.Phase != tt.want.phase || st.Reason != tt.want.reason || st.NodeName != tt.want.nodeName ||
				st.LauncherPodName != tt.want.podName || st.HypervisorClassName != tt.want.class || st.HypervisorDriver != tt.want.driver {
				t.Errorf("phase %q reason %q node %q pod %q class %q driver %q; want %q %q %q %q %q %q", st.Phase, st.Reason, st.NodeName,
					st.LauncherPodName, st.HypervisorClassName, st.HypervisorDriver, tt.want.phase, tt.want.reason, tt.want.nodeName, tt.want.podName, tt.want.class, tt.want.driver)
			}
			for typ, w := range tt.want.conds {
				c := condition(st, typ)
				if w == "-" {
					if c != nil {
						t.Errorf("condition %s = %+v, want none", typ, c)
					}
					continue
				}
				if c == nil {
					t.Errorf("condition %s missing, want %s", typ, w)
					continue
				}
				parts := strings.SplitN(w, "/", 3)
				if string(c.Status) != parts[0] || c.Reason != parts[1] || (len(parts) == 3 && !strings.Contains(c.Message, parts[2])) {
					t.Errorf("condition %s = %s/%s/%q, want %s", typ, c.Status, c.Reason, c.Message, w)
				}
				if c.Status != corev1.ConditionTrue && c.Reason != v1alpha1.ReasonSyncFailed && c.ObservedGeneration != 3 { // the handler's own are not
					t.Errorf("condition %s observedGeneration = %d, want 3", typ, c.ObservedGeneration)
				}
			}
			n := len(st.PhaseTransitionTimestamps)
			if tt.want.newPhaseTimestamp {
				if n == 0 || st.PhaseTransitionTimestamps[n-1].Phase != tt.want.phase || !st.PhaseTransitionTimestamps[n-1].PhaseTransitionTimestamp.Equal(&t1) {
					t.Errorf("phase transition timestamps = %+v, want one for %s at t1", st.PhaseTransitionTimestamps, tt.want.phase)
				}
			} else if n != len(before.Status.PhaseTransitionTimestamps) {
				t.Errorf("phase transition timestamps = %+v, want none added", st.PhaseTransitionTimestamps)
			}
			if !equality.Semantic.DeepEqual(tt.vmi, before) {
				t.Error("deriveStatus changed its input")
			}
		})
	}
}

// TestDeriveStatusRecordsPending checks that a VMI that leaves Pending in its first pass still
// has Pending among its phase transitions (creation-to-running metrics read them).
func TestDeriveStatusRecordsPending(t *testing.T) {
	st := deriveStatus(vmiWith(""), observation{ClassName: "qemu", Pod: launcher()}, t1)
	var phases []v1alpha1.VirtualMachineInstancePhase
	for _, p := range st.PhaseTransitionTimestamps {
		phases = append(phases, p.Phase)
	}
	if st.Phase != v1alpha1.Scheduling || len(phases) != 2 || phases[0] != v1alpha1.Pending || phases[1] != v1alpha1.Scheduling {
		t.Errorf("phase %s, transitions %v; want Scheduling after [Pending Scheduling]", st.Phase, phases)
	}
}

func TestDefaultClass(t *testing.T) {
	class := func(name string, isDefault, deleting bool) v1alpha1.HypervisorClass {
		c := v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Driver: "qmp"}
		if isDefault {
			c.Annotations = map[string]string{v1alpha1.IsDefaultHypervisorClassAnnotation: "true"}
		}
		if deleting {
			c.DeletionTimestamp = &t0
		}
		return c
	}
	tests := []struct {
		name       string
		classes    []v1alpha1.HypervisorClass
		want       string
		wantReason string
		wantMsg    string
	}{
		{"no classes", nil, "", v1alpha1.ReasonHypervisorClassNotFound, "none is annotated " + v1alpha1.IsDefaultHypervisorClassAnnotation + "=true"},
		{"no default", []v1alpha1.HypervisorClass{class("a", false, false)}, "", v1alpha1.ReasonHypervisorClassNotFound, "names no HypervisorClass"},
		{"one default among others", []v1alpha1.HypervisorClass{class("a", false, false), class("b", true, false)}, "b", "", ""},
		{"a default being deleted does not count", []v1alpha1.HypervisorClass{class("a", true, true), class("b", true, false)}, "b", "", ""},
		{"two defaults, named in order", []v1alpha1.HypervisorClass{class("z", true, false), class("a", true, false)}, "", v1alpha1.ReasonMultipleDefaultHypervisorClasses, "several are default: a, z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, prob := defaultClass(tt.classes)
			if tt.want != "" {
				if got == nil || got.Name != tt.want || prob != nil {
					t.Fatalf("got %v, %+v; want class %s", got, prob, tt.want)
				}
				return
			}
			if got != nil || prob == nil || prob.Reason != tt.wantReason || !strings.Contains(prob.Message, tt.wantMsg) {
				t.Fatalf("got %v, %+v; want problem %s containing %q", got, prob, tt.wantReason, tt.wantMsg)
			}
		})
	}
}

// TestDeriveStatusSELinuxLevel: status.selinuxLevel is the level the launcher pod runs at, also
// when the write that recorded it with the pod's creation was lost; without a pod it is kept;
// the controller owns it.
func TestDeriveStatusSELinuxLevel(t *testing.T) {
	atLevel := func(level string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: level}}
		}
	}
	for _, tc := range []struct {
		name, had string
		pod       *corev1.Pod
		want      string
	}{
		{"status write lost", "", launcher(atLevel("s0:c1,c2")), "s0:c1,c2"},
		{"recorded", "s0:c1,c2", launcher(atLevel("s0:c1,c2")), "s0:c1,c2"},
		{"no pod yet: kept", "s0:c1,c2", nil, "s0:c1,c2"},
		{"a pod from before levels", "", launcher(), ""},
		{"an unreadable level on the pod: the status keeps its own", "s0:c1,c2", launcher(atLevel("s0:c2,c1")), "s0:c1,c2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := vmiWith(v1alpha1.Pending, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.SELinuxLevel = tc.had })
			st := deriveStatus(vmi, observation{Pod: tc.pod}, t0)
			if st.SELinuxLevel != tc.want {
				t.Errorf("status.selinuxLevel = %q, want %q", st.SELinuxLevel, tc.want)
			}
			if got := controllerFields(st, false).SELinuxLevel; got != tc.want {
				t.Errorf("the controller's fields have selinuxLevel %q, want %q", got, tc.want)
			}
		})
	}
}
