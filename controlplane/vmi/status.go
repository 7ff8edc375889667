package vmi

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

// podScheduledCondition is the VMI condition that mirrors its launcher pod's PodScheduled
// condition (as KubeVirt's), so that an unschedulable VMI says why in its own status.
const podScheduledCondition = v1alpha1.VirtualMachineInstanceConditionType(corev1.PodScheduled)

// problem is a reason and a message for a condition, an event and status.reason alike.
type problem struct {
	Reason, Message string
}

// observation is what one reconcile saw of the world around a VMI that is not being deleted.
type observation struct {
	// ClassName is the HypervisorClass resolved in this pass; empty when none was resolved.
	ClassName string
	// Driver is the hypervisor driver of that class.
	Driver string
	// ClassProblem says why no class could be resolved (the VMI waits in Pending).
	ClassProblem *problem
	// CreateProblem says why the launcher pod could not be built or created.
	CreateProblem *problem
	// Pod is the VMI's launcher pod, nil when there is none.
	Pod *corev1.Pod
	// PodGone says that the VMI had a launcher pod (status.launcherPodName) and it no longer exists.
	PodGone bool
	// ClaimProblem says what the PersistentVolumeClaims of the VMI's volumes lack (claimsProblem),
	// looked at until the pod runs (checksClaims); nil when they are all bound. One that does not
	// exist holds the pod's creation back (holdsPod).
	ClaimProblem *problem
	// Claims are the PersistentVolumeClaims of the VMI's volumes that exist, by name, read with
	// ClaimProblem (nil when the claims were not looked at): status.volumeStatus is made of them.
	Claims map[string]*corev1.PersistentVolumeClaim
	// VolumeClaims are the PersistentVolumeClaims of the VMI's volumes that exist, by name, read
	// in every pass: the LiveMigratable condition (liveMigratable) is made of them.
	VolumeClaims map[string]*corev1.PersistentVolumeClaim
	// DriverMigrates says whether the VMI's hypervisor driver declares live migration on the
	// VMI's node (the node's v1alpha1.DriverMigrationLabel); nil when that is not known (no node
	// or driver yet, a node without the label).
	DriverMigrates *bool
	// DriverMigratesDisks says whether that driver also copies the VMI's writable node-local
	// disks (the node's v1alpha1.DriverMigrationDisksLabel); nil when not known.
	DriverMigratesDisks *bool
}

// podDown reports whether a pod is finished or on its way out.
func podDown(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
}

// deriveStatus is the VMI status the controller writes, from the previous status and what it
// observed. It is a pure function; it owns, as KubeVirt's virt-controller does, the phases up to
// Scheduled and the move to Failed when the launcher pod fails or disappears:
//
//	| observed                                          | phase                | reason / conditions                      |
//	|---------------------------------------------------|----------------------|------------------------------------------|
//	| VMI final (Succeeded, Failed)                      | unchanged            | unchanged                                |
//	| a claim of a volume does not exist, no pod        | Pending              | LauncherPodCreated=False FailedPvcNotFound naming the claim |
//	| no class (none default, several, named missing)   | Pending              | LauncherPodCreated=False HypervisorClassNotFound / MultipleDefaultHypervisorClasses |
//	| pod could not be built or created                 | Pending              | LauncherPodCreated=False FailedCreate    |
//	| pod exists, not yet bound to a node               | Scheduling           | PodScheduled copied from the pod (Unschedulable + the scheduler's message) |
//	| pod bound, not yet running                        | Scheduling           | Ready=False: a container's error (ErrImagePull naming the image), else a claim's (WaitingForVolumeBinding naming it), else GuestNotRunning |
//	| pod running                                       | Scheduled            | nodeName and PodScheduled set, Ready left to the handler |
//	| pod Failed; or Succeeded before the VMI Running   | Failed               | reason PodFailed, Ready=False naming the pod |
//	| pod had existed and is gone                       | Failed               | reason PodNotExists, Ready=False naming the pod |
//
// In every phase but a final one it sets LiveMigratable (liveMigratable) from the VMI's spec and
// the claims of its volumes.
//
// Of what it returns, the controller writes only the fields it owns (controllerFields); the
// node handler owns the lifecycle fields from its first write on, and status.nodeName, once set,
// is kept (a migration moves it). docs/architecture.md has the ownership table.
func deriveStatus(vmi *v1alpha1.VirtualMachineInstance, obs observation, now metav1.Time) v1alpha1.VirtualMachineInstanceStatus {
	prev := vmi.Status
	st := *prev.DeepCopy()
	if prev.Phase.IsFinal() {
		return st
	}
	gen := vmi.Generation
	setCond := func(c v1alpha1.VirtualMachineInstanceCondition) {
		c.ObservedGeneration = gen
		st.Conditions = v1alpha1.SetInstanceCondition(st.Conditions, c, now)
	}
	notReady := func(reason, message string) {
		setCond(v1alpha1.VirtualMachineInstanceCondition{
			Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: reason, Message: message,
		})
	}

	phase := prev.Phase
	if phase == v1alpha1.VMIPhaseUnset {
		phase = v1alpha1.Pending
	}
	className, driver := obs.ClassName, obs.Driver
	if className == "" && obs.Pod != nil {
		// Resolved in the pass that made the pod, whose status write may have been lost.
		className, driver = obs.Pod.Labels[v1alpha1.HypervisorClassLabel], obs.Pod.Labels[v1alpha1.HypervisorDriverLabel]
	}
	if className != "" {
		st.HypervisorClassName = className
	}
	if obs.Pod != nil {
		// The level the pod runs at, whose status write may have been lost.
		if l, ok, err := mcs.PodLevel(obs.Pod); err == nil && ok {
			st.SELinuxLevel = l.String()
		}
	}
	if driver != "" {
		st.HypervisorDriver = driver
	}
	if obs.Claims != nil {
		st.VolumeStatus = volumeStatus(vmi, obs.Claims)
	}
	setCond(liveMigratable(vmi, st.HypervisorDriver, obs.VolumeClaims, obs.DriverMigrates, obs.DriverMigratesDisks))
	syncProblem := obs.ClassProblem
	if syncProblem == nil {
		syncProblem = obs.CreateProblem
	}
	if obs.Pod == nil && obs.ClaimProblem.holdsPod() {
		syncProblem = &problem{Reason: obs.ClaimProblem.Reason, Message: obs.ClaimProblem.Message + "; the launcher pod is created once it exists"}
	}
	if syncProblem != nil {
		setCond(v1alpha1.VirtualMachineInstanceCondition{
			Type: v1alpha1.VirtualMachineInstanceLauncherPodCreated, Status: corev1.ConditionFalse,
			Reason: syncProblem.Reason, Message: syncProblem.Message,
		})
	} else if obs.Pod != nil {
		st.Conditions = v1alpha1.RemoveCondition(st.Conditions, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
	}

	pod := obs.Pod
	switch {
	case obs.PodGone:
		phase = v1alpha1.Failed
		st.Reason = v1alpha1.ReasonPodNotExists
		notReady(v1alpha1.ReasonPodNotExists, fmt.Sprintf("launcher pod %s was deleted before the VMI finished", prev.LauncherPodName))

	case pod == nil:
		if syncProblem == nil {
			notReady(v1alpha1.ReasonPodNotExists, "the launcher pod does not exist yet")
		} else {
			notReady(syncProblem.Reason, syncProblem.Message)
		}

	default:
		if st.LauncherPodName == "" {
			st.LauncherPodName = pod.Name
		}
		// A bound pod's PodScheduled=True and its node reach the status with Scheduled (as in
		// KubeVirt), not in a write of their own while the pod starts; the node's label, which
		// the node's handler selects on, is set as soon as the pod is bound (reconcile).
		// PodScheduled=False, and a change of a condition the VMI has, are copied at once.
		podRuns := pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil
		starting := (phase == v1alpha1.Pending || phase == v1alpha1.Scheduling) && !podRuns && !podDown(pod)
		if c := podCondition(pod, corev1.PodScheduled); c != nil &&
			(!starting || c.Status != corev1.ConditionTrue || condition(st, podScheduledCondition) != nil) {
			setCond(v1alpha1.VirtualMachineInstanceCondition{
				Type: podScheduledCondition, Status: c.Status, Reason: c.Reason, Message: c.Message,
			})
		}
		if pod.Spec.NodeName != "" && st.NodeName == "" && !starting {
			st.NodeName = pod.Spec.NodeName
		}
		beforeRunning := phase == v1alpha1.Pending || phase == v1alpha1.Scheduling || phase == v1alpha1.Scheduled
		switch {
		case pod.Status.Phase == corev1.PodFailed || (pod.Status.Phase == corev1.PodSucceeded && beforeRunning):
			phase = v1alpha1.Failed
			st.Reason = v1alpha1.ReasonPodFailed
			notReady(v1alpha1.ReasonPodFailed, fmt.Sprintf("launcher pod %s %s", pod.Name, describePodEnd(pod)))
		case phase == v1alpha1.Pending || phase == v1alpha1.Scheduling:
			phase = v1alpha1.Scheduling
			if podRuns {
				phase = v1alpha1.Scheduled
			}
			// Until the handler takes over (Scheduled), Ready says what the pod lacks: a
			// container's error when one has it (an image that cannot be pulled), else what a
			// claim of its volumes lacks, else that it is not running yet — one message from
			// creation to Running, so that the pod's progress on the way (conditions
			// appearing, containers starting) writes nothing.
			switch reason, msg := containerProblem(vmi, pod); {
			case podDown(pod):
				notReady(v1alpha1.ReasonPodTerminating, fmt.Sprintf("launcher pod %s is terminating", pod.Name))
			case phase == v1alpha1.Scheduled:
				// The handler's from here: the Ready it writes is its own, not laid over this
				// one (whose reason and message it would not own).
				st.Conditions = v1alpha1.RemoveCondition(st.Conditions, v1alpha1.VirtualMachineInstanceReady)
			case reason != "":
				notReady(reason, msg)
			case obs.ClaimProblem != nil:
				notReady(obs.ClaimProblem.Reason, obs.ClaimProblem.Message)
			default:
				notReady(v1alpha1.ReasonGuestNotRunning, fmt.Sprintf("launcher pod %s is not running yet", pod.Name))
			}
		}
	}

	if phase != prev.Phase {
		if prev.Phase == v1alpha1.VMIPhaseUnset && phase != v1alpha1.Pending {
			// Accepted and moved on in one pass: Pending is still a phase it went through.
			st.PhaseTransitionTimestamps = append(st.PhaseTransitionTimestamps,
				v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: v1alpha1.Pending, PhaseTransitionTimestamp: now})
		}
		st.Phase = phase
		st.PhaseTransitionTimestamps = append(st.PhaseTransitionTimestamps,
			v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: now})
	}
	return st
}

// containerProblem is the first error a container of the VMI's launcher pod waits on
// (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, ...: the kubelet's reason, the
// condition's reason) with a message naming the pod, the container, the containerDisk volume
// whose container it is, its image and the kubelet's message; "" when every container is
// starting or running normally.
func containerProblem(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (reason, message string) {
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		w := cs.State.Waiting
		if w == nil || w.Reason == "" || w.Reason == "ContainerCreating" || w.Reason == "PodInitializing" {
			continue
		}
		image := cs.Image
		if image == "" {
			image = specImage(pod, cs.Name)
		}
		what := "image " + image
		for _, v := range vmi.Spec.Volumes {
			if v.ContainerDisk != nil && launcherpod.ContainerDiskContainer(v.Name) == cs.Name {
				what = "containerDisk volume " + v.Name + ", " + what
				break
			}
		}
		msg := fmt.Sprintf("launcher pod %s: container %s (%s): %s", pod.Name, cs.Name, what, w.Reason)
		if w.Message != "" {
			msg += ": " + w.Message
		}
		return w.Reason, msg
	}
	return "", ""
}

// specImage is the image of pod's (init) container name, "" when it has none.
func specImage(pod *corev1.Pod, name string) string {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}

// describePodEnd says how a finished pod ended: the pod's own reason and message, else the
// launcher container's termination.
func describePodEnd(pod *corev1.Pod) string {
	verb := "failed"
	if pod.Status.Phase == corev1.PodSucceeded {
		verb = "completed before the guest ran"
	}
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		return fmt.Sprintf("%s: %s %s", verb, pod.Status.Reason, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil {
			return fmt.Sprintf("%s: container %s exited with code %d (%s) %s", verb, cs.Name, term.ExitCode, term.Reason, term.Message)
		}
	}
	return verb
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// condition returns the condition of type t in st, or nil.
func condition(st v1alpha1.VirtualMachineInstanceStatus, t v1alpha1.VirtualMachineInstanceConditionType) *v1alpha1.VirtualMachineInstanceCondition {
	return v1alpha1.InstanceCondition(st.Conditions, t)
}

// controllerFields returns of st the fields the VMI controller owns: hypervisorClassName,
// hypervisorDriver, launcherPodName, nodeName, volumeStatus, selinuxLevel and the PodScheduled, LauncherPodCreated and
// LiveMigratable conditions; with
// lifecycle, also the lifecycle fields (v1alpha1.LifecycleFields), which it owns until a node
// handler takes them over, and takes back only to end a VMI whose launcher pod failed or is gone.
func controllerFields(st v1alpha1.VirtualMachineInstanceStatus, lifecycle bool) v1alpha1.VirtualMachineInstanceStatus {
	var out v1alpha1.VirtualMachineInstanceStatus
	if lifecycle {
		out = v1alpha1.LifecycleFields(st)
	}
	out.HypervisorClassName, out.HypervisorDriver = st.HypervisorClassName, st.HypervisorDriver
	out.LauncherPodName, out.NodeName = st.LauncherPodName, st.NodeName
	out.VolumeStatus = st.VolumeStatus
	out.SELinuxLevel = st.SELinuxLevel
	for _, t := range []v1alpha1.VirtualMachineInstanceConditionType{podScheduledCondition, v1alpha1.VirtualMachineInstanceLauncherPodCreated, v1alpha1.VirtualMachineInstanceIsMigratable} {
		if c := v1alpha1.InstanceCondition(st.Conditions, t); c != nil {
			out.Conditions = append(out.Conditions, *c)
		}
	}
	return out
}
