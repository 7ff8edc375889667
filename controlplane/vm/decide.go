package vm

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/backoff"
)

// Reasons the VM controller sets that constants.go does not define; they are used for condition
// reasons and event reasons alike.
const (
	// ReasonRunStrategyConflict says spec.running and spec.runStrategy are both set (Failure=True).
	ReasonRunStrategyConflict = "RunStrategyConflict"
	// ReasonVMINotExists says the VM has no VMI (Ready=False), as KubeVirt says it.
	ReasonVMINotExists = "VMINotExists"
	// ReasonVMINotOwned says a VMI with the VM's name exists but another owner controls it (Failure=True).
	ReasonVMINotOwned = "VMINotOwned"
)

// Action is what the controller does to the VM's VMI in one reconcile.
type Action int

const (
	// ActionNone leaves the VMI as it is.
	ActionNone Action = iota
	// ActionCreate creates the VMI from spec.template.
	ActionCreate
	// ActionDelete deletes the VMI (the one passed to Decide).
	ActionDelete
)

func (a Action) String() string {
	switch a {
	case ActionCreate:
		return "Create"
	case ActionDelete:
		return "Delete"
	default:
		return "None"
	}
}

// Backoff is the crash-loop back-off of VMIs that fail under Always or RerunOnFailure: the delay
// after the n-th consecutive failure is Initial·2^(n-1), at most Max (core/backoff).
type Backoff = backoff.Exponential

// Decision is what Decide concludes for one VM: the action on its VMI and the VM status to write.
type Decision struct {
	Action Action
	// Reason and Message explain Action (for the Normal event the reconciler records).
	Reason  string
	Message string
	// Status is the VM status to write, as seen before Action; once a create succeeds the
	// reconciler marks it created and Starting, and the VMI's watch event brings the rest.
	Status v1alpha1.VirtualMachineStatus
	// RequeueAfter asks for another look once a crash-loop back-off has passed.
	RequeueAfter time.Duration
	// RemoveFinalizer says the VM is being deleted and its VMI is gone.
	RemoveFinalizer bool
}

// errRunStrategyConflict is returned by RunStrategy when spec.running and spec.runStrategy are both set.
var errRunStrategyConflict = errors.New("spec.running and spec.runStrategy are mutually exclusive; nothing is started until one is removed")

// RunStrategy is the run strategy the spec asks for: spec.runStrategy, else the legacy
// spec.running (true is Always, false is Halted), else Halted. Both set is an error.
func RunStrategy(spec v1alpha1.VirtualMachineSpec) (v1alpha1.VirtualMachineRunStrategy, error) {
	switch {
	case spec.Running != nil && spec.RunStrategy != nil:
		return v1alpha1.RunStrategyUnknown, errRunStrategyConflict
	case spec.RunStrategy != nil:
		return *spec.RunStrategy, nil
	case spec.Running != nil && *spec.Running:
		return v1alpha1.RunStrategyAlways, nil
	default:
		return v1alpha1.RunStrategyHalted, nil
	}
}

// isFinal says the VMI has stopped for good (KubeVirt's IsFinal).
func isFinal(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi.Status.Phase == v1alpha1.Succeeded || vmi.Status.Phase == v1alpha1.Failed
}

// Decide is the VM controller's logic: given the VM, its VMI (nil when none exists; a VMI with
// the VM's name that the VM does not control must be passed as nil and flagged with foreign),
// the time and the back-off, it says what to do with the VMI and what the VM status becomes.
func Decide(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, foreign bool, now time.Time, backoff Backoff) Decision {
	d := Decision{Status: *vm.Status.DeepCopy()}
	st := &d.Status
	st.DesiredGeneration = vm.Generation
	strategy, specErr := RunStrategy(vm.Spec)
	st.RunStrategy = strategy

	switch {
	case vm.DeletionTimestamp != nil:
		// The VMI goes first so that its teardown runs while the VM still shows Terminating.
		if vmi != nil && vmi.DeletionTimestamp == nil {
			d.Action, d.Reason, d.Message = ActionDelete, v1alpha1.ReasonSuccessfulDelete, "VM is being deleted"
		}
		d.RemoveFinalizer = vmi == nil
	case specErr != nil:
		// Neither strategy wins: act on nothing, not even an existing VMI, until the user decides.
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineFailure, corev1.ConditionTrue, ReasonRunStrategyConflict, specErr.Error())
	case foreign:
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineFailure, corev1.ConditionTrue, ReasonVMINotOwned,
			fmt.Sprintf("a VirtualMachineInstance named %q exists that this VM does not control", vm.Name))
	default:
		removeCondition(st, v1alpha1.VirtualMachineFailure, ReasonRunStrategyConflict, ReasonVMINotOwned)
		trackStartFailure(st, vmi, strategy, now, backoff)
		decideRequests(&d, vmi, strategy)
		if d.Action == ActionNone && !d.requestsPending(vmi) {
			decideStrategy(&d, vmi, strategy, now)
		}
	}

	setObserved(st, vm, vmi, now, d.Action == ActionDelete)
	st.PrintableStatus = printableStatus(vm, vmi, st, strategy, now, d.Action == ActionDelete)
	return d
}

// requestsPending says the first state change request is still being carried out (a Stop whose
// VMI is still going away), so the run strategy must not act yet.
func (d *Decision) requestsPending(vmi *v1alpha1.VirtualMachineInstance) bool {
	if len(d.Status.StateChangeRequests) == 0 {
		return false
	}
	r := d.Status.StateChangeRequests[0]
	return r.Action == v1alpha1.StopRequest && vmi != nil && matchesUID(r, vmi)
}

func matchesUID(r v1alpha1.VirtualMachineStateChangeRequest, vmi *v1alpha1.VirtualMachineInstance) bool {
	return r.UID == nil || *r.UID == vmi.UID
}

// decideRequests applies status.stateChangeRequests in order, KubeVirt's way: a Stop deletes the
// VMI it names (any VMI without a UID) and is removed once that VMI is gone; a Start creates a VMI
// when none exists (replacing a finished one first) and is removed once one exists. Requests that
// cannot apply (a Start under Halted, a Stop naming a VMI that is gone) are dropped.
func decideRequests(d *Decision, vmi *v1alpha1.VirtualMachineInstance, strategy v1alpha1.VirtualMachineRunStrategy) {
	st := &d.Status
	for len(st.StateChangeRequests) > 0 {
		r := st.StateChangeRequests[0]
		switch r.Action {
		case v1alpha1.StopRequest:
			if vmi != nil && matchesUID(r, vmi) {
				if vmi.DeletionTimestamp == nil {
					d.Action, d.Reason, d.Message = ActionDelete, v1alpha1.ReasonSuccessfulDelete, "stop requested"
				}
				return
			}
		case v1alpha1.StartRequest:
			if strategy == v1alpha1.RunStrategyHalted {
				break
			}
			switch {
			case vmi == nil:
				d.Action, d.Reason, d.Message = ActionCreate, v1alpha1.ReasonSuccessfulCreate, "start requested"
			case vmi.DeletionTimestamp != nil:
				return
			case isFinal(vmi):
				// A finished VMI keeps the name: delete it, create the new one once it is gone.
				d.Action, d.Reason, d.Message = ActionDelete, v1alpha1.ReasonSuccessfulDelete, "start requested: replacing finished VMI"
				return
			}
		}
		st.StateChangeRequests = st.StateChangeRequests[1:]
		if d.Action != ActionNone {
			break
		}
	}
	if len(st.StateChangeRequests) == 0 {
		st.StateChangeRequests = nil
	}
}

// decideStrategy applies the run strategy when no request is acting.
func decideStrategy(d *Decision, vmi *v1alpha1.VirtualMachineInstance, strategy v1alpha1.VirtualMachineRunStrategy, now time.Time) {
	if vmi != nil && vmi.DeletionTimestamp != nil {
		return // wait for it to go
	}
	switch strategy {
	case v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure:
		if vmi == nil {
			if wait := retryAfter(d.Status.StartFailure, now); wait > 0 {
				d.RequeueAfter = wait
				return
			}
			d.Action, d.Reason, d.Message = ActionCreate, v1alpha1.ReasonSuccessfulCreate, fmt.Sprintf("runStrategy %s", strategy)
			return
		}
		restart := vmi.Status.Phase == v1alpha1.Failed ||
			(strategy == v1alpha1.RunStrategyAlways && vmi.Status.Phase == v1alpha1.Succeeded)
		if restart {
			d.Action, d.Reason = ActionDelete, v1alpha1.ReasonSuccessfulDelete
			d.Message = fmt.Sprintf("runStrategy %s: VMI %s, restarting", strategy, vmi.Status.Phase)
		}
	case v1alpha1.RunStrategyOnce:
		// The finished VMI is kept, which is what keeps it from running again.
		if vmi == nil {
			d.Action, d.Reason, d.Message = ActionCreate, v1alpha1.ReasonSuccessfulCreate, "runStrategy Once"
		}
	case v1alpha1.RunStrategyHalted:
		if vmi != nil {
			d.Action, d.Reason, d.Message = ActionDelete, v1alpha1.ReasonSuccessfulDelete, "runStrategy Halted"
		}
	case v1alpha1.RunStrategyManual:
		// Only requests start and stop it.
	}
}

func retryAfter(sf *v1alpha1.VirtualMachineStartFailure, now time.Time) time.Duration {
	if sf == nil || sf.RetryAfterTimestamp == nil {
		return 0
	}
	return sf.RetryAfterTimestamp.Sub(now)
}

// trackStartFailure counts each failed VMI once (by UID) under the strategies that restart
// failed VMIs, and forgets the count once a later VMI reaches Running.
func trackStartFailure(st *v1alpha1.VirtualMachineStatus, vmi *v1alpha1.VirtualMachineInstance, strategy v1alpha1.VirtualMachineRunStrategy, now time.Time, backoff Backoff) {
	if strategy != v1alpha1.RunStrategyAlways && strategy != v1alpha1.RunStrategyRerunOnFailure {
		st.StartFailure = nil
		return
	}
	if vmi == nil {
		return
	}
	sf := st.StartFailure
	switch vmi.Status.Phase {
	case v1alpha1.Failed:
		if sf != nil && sf.LastFailedVMIUID == vmi.UID {
			return
		}
		n := 1
		if sf != nil {
			n = sf.ConsecutiveFailCount + 1
		}
		retry := metav1.NewTime(now.Add(backoff.Delay(n)))
		st.StartFailure = &v1alpha1.VirtualMachineStartFailure{ConsecutiveFailCount: n, LastFailedVMIUID: vmi.UID, RetryAfterTimestamp: &retry}
	case v1alpha1.Running:
		if sf != nil && sf.LastFailedVMIUID != vmi.UID {
			st.StartFailure = nil
		}
	}
}

// generationAnnotation records on a VMI the VM generation it was created from.
const generationAnnotation = v1alpha1.LabelPrefix + "vm-generation"

// setObserved fills created, ready, observedGeneration and the Ready and Paused conditions from the VMI.
func setObserved(st *v1alpha1.VirtualMachineStatus, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, now time.Time, deleting bool) {
	st.Created = vmi != nil
	st.Ready = false
	if vmi == nil {
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineReady, corev1.ConditionFalse, ReasonVMINotExists, "VMI does not exist")
		removeCondition(st, v1alpha1.VirtualMachinePaused)
		return
	}
	if g, ok := vmi.Annotations[generationAnnotation]; ok {
		var n int64
		if _, err := fmt.Sscan(g, &n); err == nil {
			st.ObservedGeneration = n
		}
	}
	ready := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	switch {
	case vmi.DeletionTimestamp != nil || deleting:
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineReady, corev1.ConditionFalse, v1alpha1.ReasonPodTerminating, "VMI is being deleted")
	case ready != nil:
		st.Ready = ready.Status == corev1.ConditionTrue && vmi.Status.Phase == v1alpha1.Running
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineReady, ready.Status, ready.Reason, ready.Message)
	default:
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachineReady, corev1.ConditionFalse, v1alpha1.ReasonGuestNotRunning,
			fmt.Sprintf("VMI is in phase %q", vmi.Status.Phase))
	}
	if p := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstancePaused); p != nil && p.Status == corev1.ConditionTrue {
		setCondition(st, vm.Generation, now, v1alpha1.VirtualMachinePaused, corev1.ConditionTrue, p.Reason, p.Message)
	} else {
		removeCondition(st, v1alpha1.VirtualMachinePaused)
	}
}

// printableStatus summarises the VM as kubectl shows it, with KubeVirt's values in KubeVirt's
// order of precedence; the first that applies wins:
//
//	| status                  | when                                                                  |
//	|-------------------------|-----------------------------------------------------------------------|
//	| Terminating             | the VM is being deleted                                               |
//	| CrashLoopBackOff        | no VMI running, a failed one is waited on (Always, RerunOnFailure)     |
//	| Stopped                 | no VMI, or it is final                                                |
//	| Stopping                | the VMI is being deleted, or is about to be                           |
//	| Migrating               | the VMI runs and a live migration is in progress                      |
//	| Paused                  | the VMI runs, Paused=True                                             |
//	| Running                 | the VMI runs                                                          |
//	| Unknown                 | the VMI's phase is Unknown (its node does not answer)                 |
//	| ErrorPvcNotFound        | not running yet: a claim of its volumes does not exist (FailedPvcNotFound) |
//	| ErrorUnschedulable      | not running yet: the scheduler cannot place its launcher pod          |
//	| Provisioning            | not running yet: Provisioning=True                                    |
//	| WaitingForVolumeBinding | not running yet: a claim of its volumes is not bound                  |
//	| ErrImagePull            | not running yet: a container image of its launcher pod cannot be pulled |
//	| ImagePullBackOff        | not running yet: the kubelet waits before pulling that image again    |
//	| Starting                | not running yet, nothing wrong known                                  |
//
// The not-running reasons are the VMI controller's: its LauncherPodCreated=False or Ready=False
// (vmiHeldBy), and the PodScheduled it copies from the launcher pod.
func printableStatus(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, st *v1alpha1.VirtualMachineStatus,
	strategy v1alpha1.VirtualMachineRunStrategy, now time.Time, deleting bool) v1alpha1.VirtualMachinePrintableStatus {
	crashLoop := (strategy == v1alpha1.RunStrategyAlways || strategy == v1alpha1.RunStrategyRerunOnFailure) &&
		retryAfter(st.StartFailure, now) > 0
	switch {
	case vm.DeletionTimestamp != nil:
		return v1alpha1.VirtualMachineStatusTerminating
	case vmi == nil:
		if crashLoop {
			return v1alpha1.VirtualMachineStatusCrashLoopBackOff
		}
		return v1alpha1.VirtualMachineStatusStopped
	case isFinal(vmi):
		if crashLoop {
			return v1alpha1.VirtualMachineStatusCrashLoopBackOff
		}
		return v1alpha1.VirtualMachineStatusStopped
	case vmi.DeletionTimestamp != nil || deleting:
		return v1alpha1.VirtualMachineStatusStopping
	}
	switch vmi.Status.Phase {
	case v1alpha1.Running:
		if ms := vmi.Status.MigrationState; ms != nil && !ms.Completed && !ms.Failed {
			return v1alpha1.VirtualMachineStatusMigrating
		}
		if hasTrueVMICondition(vmi, v1alpha1.VirtualMachineInstancePaused) {
			return v1alpha1.VirtualMachineStatusPaused
		}
		return v1alpha1.VirtualMachineStatusRunning
	case v1alpha1.Unknown:
		return v1alpha1.VirtualMachineStatusUnknown
	}
	// Not running yet: Pending, Scheduling, Scheduled or no phase. What keeps it from running
	// comes first, in KubeVirt's order: a claim that does not exist, the scheduler's refusal,
	// volumes being provisioned, a claim not bound, an image that cannot be pulled.
	switch {
	case vmiHeldBy(vmi, v1alpha1.ReasonFailedPvcNotFound):
		return v1alpha1.VirtualMachineStatusPvcNotFound
	case unschedulable(vmi):
		return v1alpha1.VirtualMachineStatusUnschedulable
	case hasTrueVMICondition(vmi, v1alpha1.VirtualMachineInstanceProvisioning):
		return v1alpha1.VirtualMachineStatusProvisioning
	case vmiHeldBy(vmi, v1alpha1.ReasonWaitingForVolumeBinding):
		return v1alpha1.VirtualMachineStatusWaitingForVolumeBinding
	case vmiHeldBy(vmi, v1alpha1.ReasonErrImagePull):
		return v1alpha1.VirtualMachineStatusErrImagePull
	case vmiHeldBy(vmi, v1alpha1.ReasonImagePullBackOff):
		return v1alpha1.VirtualMachineStatusImagePullBackOff
	}
	return v1alpha1.VirtualMachineStatusStarting
}

// unschedulable says the VMI's launcher pod cannot be scheduled: the VMI's reason, or a
// condition that is not True with reason Unschedulable (PodScheduled, copied from the pod).
func unschedulable(vmi *v1alpha1.VirtualMachineInstance) bool {
	if vmi.Status.Reason == v1alpha1.ReasonUnschedulable {
		return true
	}
	for _, c := range vmi.Status.Conditions {
		if c.Reason == v1alpha1.ReasonUnschedulable && c.Status != corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// vmiHeldBy says the VMI controller reports reason as what keeps the VMI from starting: its
// LauncherPodCreated=False (no pod could be created) or Ready=False (what the pod lacks) carries it.
func vmiHeldBy(vmi *v1alpha1.VirtualMachineInstance, reason string) bool {
	for _, t := range []v1alpha1.VirtualMachineInstanceConditionType{v1alpha1.VirtualMachineInstanceLauncherPodCreated, v1alpha1.VirtualMachineInstanceReady} {
		if c := v1alpha1.InstanceCondition(vmi.Status.Conditions, t); c != nil && c.Status == corev1.ConditionFalse && c.Reason == reason {
			return true
		}
	}
	return false
}

func hasTrueVMICondition(vmi *v1alpha1.VirtualMachineInstance, t v1alpha1.VirtualMachineInstanceConditionType) bool {
	c := v1alpha1.InstanceCondition(vmi.Status.Conditions, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// setCondition sets a VM condition (v1alpha1.SetCondition) observed at generation.
func setCondition(st *v1alpha1.VirtualMachineStatus, generation int64, now time.Time, t v1alpha1.VirtualMachineConditionType,
	status corev1.ConditionStatus, reason, message string) {
	st.Conditions = v1alpha1.SetCondition(st.Conditions, v1alpha1.VirtualMachineCondition{
		Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	}, metav1.NewTime(now))
}

// removeCondition drops the condition of type t; with reasons given, only when it carries one of them.
func removeCondition(st *v1alpha1.VirtualMachineStatus, t v1alpha1.VirtualMachineConditionType, reasons ...string) {
	st.Conditions = v1alpha1.RemoveCondition(st.Conditions, t, reasons...)
}
