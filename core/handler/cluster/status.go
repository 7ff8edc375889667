package cluster

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// handlerConditions are the VMI conditions the node handler owns besides Ready, which is one of
// the lifecycle fields (v1alpha1.LifecycleFields).
var handlerConditions = []v1alpha1.VirtualMachineInstanceConditionType{
	v1alpha1.VirtualMachineInstancePaused,
	v1alpha1.VirtualMachineInstanceSynchronized,
	v1alpha1.VirtualMachineInstanceAgentConnected,
}

// statusWrite is what the node handler writes of a VMI's status by server-side apply.
type statusWrite struct {
	// Status holds the fields the handler owns and writes; the others are empty.
	Status v1alpha1.VirtualMachineInstanceStatus
	// Lifecycle says Status holds the lifecycle fields.
	Lifecycle bool
	// TakeOver says the apply takes the lifecycle fields over from their owner (forced,
	// preconditioned on the resourceVersion the decision was made on).
	TakeOver bool
	// Release says the handler still shares lifecycle fields it no longer owns: an apply
	// without them gives them up, even when nothing else changed.
	Release bool
}

// handlerStatus decides what the handler of manager writes of the status node it derived for
// the VMI stored. It is a pure function. The handler owns the Paused, Synchronized and
// AgentConnected conditions, status.interfaces and status.guestOSInfo, and the lifecycle fields
// from its first write on:
//
//   - a VMI that is not final: the handler writes its lifecycle fields, taking them over when
//     another writer (the VMI controller, up to Scheduled) owns them; a phase that would move
//     back (the handler behind the API, after a restart) is not written, the stored one stays;
//     phase transition timestamps are the stored ones and the handler's of the phases not yet
//     there;
//   - a final VMI: nothing it owns changes any more but the interfaces, while the node still
//     reports any; lifecycle fields it owns alone are written as they are stored, and those
//     another writer took over (the VMI controller ending a VMI whose pod failed or went away)
//     are left to that writer.
//
// status.nodeName is the VMI controller's; the handler does not write it.
func handlerStatus(stored *v1alpha1.VirtualMachineInstance, node v1alpha1.VirtualMachineInstanceStatus, manager string) statusWrite {
	alone := v1alpha1.HoldsLifecycle(stored, manager)
	mine := v1alpha1.SharesLifecycle(stored, manager)
	api := stored.Status

	if api.Phase.IsFinal() {
		w := statusWrite{Status: handlerFields(api), Lifecycle: alone, Release: mine && !alone}
		if alone {
			withLifecycle(&w.Status, v1alpha1.LifecycleFields(api))
		}
		if len(node.Interfaces) > 0 {
			w.Status.Interfaces = node.Interfaces
		}
		return w
	}

	if node.Phase == v1alpha1.VMIPhaseUnset && !alone {
		// Nothing to say of the VMI's life: no reason to take it over.
		return statusWrite{Status: handlerFields(node), Release: mine}
	}
	w := statusWrite{Status: handlerFields(node), Lifecycle: true, TakeOver: !alone}
	life := v1alpha1.LifecycleFields(node)
	switch {
	case node.Phase == v1alpha1.VMIPhaseUnset:
		life = v1alpha1.LifecycleFields(api)
	case !api.Phase.CanMoveTo(node.Phase):
		life.Phase, life.Reason = api.Phase, api.Reason
		life.PhaseTransitionTimestamps = slices.Clone(api.PhaseTransitionTimestamps)
	default:
		ts := slices.Clone(api.PhaseTransitionTimestamps)
		for _, t := range node.PhaseTransitionTimestamps {
			if !slices.ContainsFunc(ts, func(o v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp) bool { return o.Phase == t.Phase }) {
				ts = append(ts, t)
			}
		}
		life.PhaseTransitionTimestamps = ts
	}
	withLifecycle(&w.Status, life)
	return w
}

// handlerFields returns of st the fields the handler owns besides the lifecycle fields: the
// Paused, Synchronized and AgentConnected conditions, the interfaces and the guest OS info.
func handlerFields(st v1alpha1.VirtualMachineInstanceStatus) v1alpha1.VirtualMachineInstanceStatus {
	out := v1alpha1.VirtualMachineInstanceStatus{Interfaces: slices.Clone(st.Interfaces), GuestOSInfo: st.GuestOSInfo}
	for _, t := range handlerConditions {
		if c := v1alpha1.InstanceCondition(st.Conditions, t); c != nil {
			out.Conditions = append(out.Conditions, *c)
		}
	}
	return out
}

// withLifecycle adds the lifecycle fields life to st.
func withLifecycle(st *v1alpha1.VirtualMachineInstanceStatus, life v1alpha1.VirtualMachineInstanceStatus) {
	st.Phase, st.Reason, st.PhaseTransitionTimestamps = life.Phase, life.Reason, life.PhaseTransitionTimestamps
	st.Conditions = append(life.Conditions, st.Conditions...)
}

// apply returns the body of the server-side apply of w to the VMI stored, and whether it changes
// anything: a field's value, or what the handler gives up (Release). A take-over is
// preconditioned on the resourceVersion of stored.
func (w statusWrite) apply(stored *v1alpha1.VirtualMachineInstance) (*unstructured.Unstructured, bool, error) {
	rv := ""
	if w.TakeOver {
		rv = stored.ResourceVersion
	}
	body, err := v1alpha1.StatusApply(stored, &w.Status, rv)
	if err != nil {
		return nil, false, err
	}
	have := handlerFields(stored.Status)
	if w.Lifecycle {
		withLifecycle(&have, v1alpha1.LifecycleFields(stored.Status))
	}
	current, err := v1alpha1.StatusApply(stored, &have, rv)
	if err != nil {
		return nil, false, err
	}
	return body, w.Release || !equality.Semantic.DeepEqual(body.Object, current.Object), nil
}
