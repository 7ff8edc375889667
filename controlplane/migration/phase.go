package migration

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Reasons of the migration controller's events and of a failed migration's failureReason, so
// that the Warning event and the status that it explains carry the same word.
const (
	// ReasonVMINotFound says the migration names a VMI that does not exist.
	ReasonVMINotFound = "VMINotFound"
	// ReasonVMINotRunning says the VMI is not Running (or stopped running during the migration).
	ReasonVMINotRunning = "VMINotRunning"
	// ReasonNotLiveMigratable says the VMI's LiveMigratable condition is not True.
	ReasonNotLiveMigratable = "NotLiveMigratable"
	// ReasonMigrationInProgress says another migration of the same VMI has not finished.
	ReasonMigrationInProgress = "MigrationInProgress"
	// ReasonSourcePodNotFound says the VMI's launcher pod (the source) could not be found.
	ReasonSourcePodNotFound = "SourcePodNotFound"
	// ReasonTargetPodFailed says the target launcher pod failed or went away before the guest moved.
	ReasonTargetPodFailed = "TargetPodFailed"
	// ReasonTargetReady says the target launcher pod runs and the node side may copy the guest.
	ReasonTargetReady = "TargetReady"
	// ReasonAbortRequested says the migration was deleted before it finished.
	ReasonAbortRequested = "AbortRequested"
	// ReasonThrottled says a limit on parallel migrations holds the migration in Pending.
	ReasonThrottled = "Throttled"
	// ReasonNodeStartTimeout says the node side did not start the migration in time.
	ReasonNodeStartTimeout = "NodeStartTimeout"
	// ReasonTargetPodUnschedulable says no node took the target pod in time.
	ReasonTargetPodUnschedulable = "TargetPodUnschedulable"
)

// Observation is what the reconciler saw of the world for one migration; Next decides the
// phase from it alone.
type Observation struct {
	// Phase is the migration's current phase.
	Phase v1alpha1.VirtualMachineInstanceMigrationPhase
	// VMI is the migrated VMI, nil when it does not exist.
	VMI *v1alpha1.VirtualMachineInstance
	// SourcePodFound says the VMI's current launcher pod exists.
	SourcePodFound bool
	// TargetPodCreated says the target pod was created earlier (it is recorded in the status).
	TargetPodCreated bool
	// TargetPod is the target launcher pod, nil when it does not exist (or was never created).
	TargetPod *corev1.Pod
	// MigrationUID is the migration's UID, to recognise its own migrationState on the VMI.
	MigrationUID string
	// Throttled, when set, says which limit on parallel migrations holds this one in Pending.
	Throttled string
	// WaitingForNode is how long the migration has been TargetReady without the node side
	// starting it.
	WaitingForNode time.Duration
	// Scheduling is how long the migration has been in Scheduling.
	Scheduling time.Duration
}

// TargetPodPendingTimeout is how long a target pod may stay unschedulable (no node fits: none
// other than the source, none with the class's driver, no room) before the migration fails.
const TargetPodPendingTimeout = 5 * time.Minute

// NodeStartTimeout is how long a migration may stay TargetReady before the node side starts
// it (the target handler prepares its VM and the source handler begins to copy): longer means
// a handler that cannot take part (down, or without its node certificate).
const NodeStartTimeout = 5 * time.Minute

// Decision is the phase a migration moves to, and why when it fails.
type Decision struct {
	Phase   v1alpha1.VirtualMachineInstanceMigrationPhase
	Reason  string
	Message string
}

func failed(reason, format string, args ...any) Decision {
	return Decision{Phase: v1alpha1.MigrationFailed, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Next returns the phase that follows obs.Phase given what was observed. It is pure: the
// reconciler performs the effects of the phase it returns (create the target pod in Scheduling,
// hand the migration to the node side in TargetReady, clean up in Failed).
//
// Pending → Scheduling once the VMI is Running, LiveMigratable and its launcher pod is found;
// Scheduling → TargetReady once the target pod is bound to a node and Running; TargetReady →
// Running → Succeeded/Failed follow the VMI's migrationState, which the node side writes while
// it copies the guest. Succeeded and Failed are final.
func Next(obs Observation) Decision {
	switch obs.Phase {
	case v1alpha1.MigrationSucceeded, v1alpha1.MigrationFailed:
		return Decision{Phase: obs.Phase}
	case v1alpha1.MigrationPhaseUnset:
		return Decision{Phase: v1alpha1.MigrationPending}
	}
	vmi := obs.VMI
	if vmi == nil {
		return failed(ReasonVMINotFound, "VMI not found")
	}
	state := vmi.Status.MigrationState
	ours := state != nil && string(state.MigrationUID) == obs.MigrationUID
	// Once the node side reports an outcome, it is the truth, whatever the pods look like.
	if ours && state.Completed {
		return Decision{Phase: v1alpha1.MigrationSucceeded}
	}
	if ours && state.Failed {
		reason := state.FailureReason
		if reason == "" {
			reason = "the node side reported the migration failed"
		}
		return failed(v1alpha1.ReasonMigrationFailed, "%s", reason)
	}
	if vmi.Status.Phase != v1alpha1.Running {
		return failed(ReasonVMINotRunning, "VMI is %s, not Running", phaseWord(vmi.Status.Phase))
	}
	// Two migrations of one VMI may both pass Pending before either hands off; the one that
	// finds the other's state on the VMI gives way.
	if obs.Phase != v1alpha1.MigrationPending && state != nil && !ours && !state.Completed && !state.Failed {
		return failed(ReasonMigrationInProgress, "migration %s of this VMI has not finished", state.MigrationUID)
	}
	if obs.Phase == v1alpha1.MigrationPending {
		if c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable); c == nil || c.Status != corev1.ConditionTrue {
			msg := "VMI has no LiveMigratable condition"
			if c != nil {
				msg = fmt.Sprintf("VMI is not LiveMigratable (%s: %s)", c.Reason, c.Message)
			}
			return failed(ReasonNotLiveMigratable, "%s", msg)
		}
		if state != nil && !ours && !state.Completed && !state.Failed {
			return failed(ReasonMigrationInProgress, "migration %s of this VMI has not finished", state.MigrationUID)
		}
		if !obs.SourcePodFound {
			return failed(ReasonSourcePodNotFound, "no launcher pod of the VMI found on node %q", vmi.Status.NodeName)
		}
		if obs.Throttled != "" {
			return Decision{Phase: v1alpha1.MigrationPending, Reason: ReasonThrottled, Message: obs.Throttled}
		}
		return Decision{Phase: v1alpha1.MigrationScheduling}
	}
	// Scheduling, TargetReady, Running: the target pod must stay alive until the guest moved.
	if !obs.TargetPodCreated && (obs.Phase == v1alpha1.MigrationTargetReady || obs.Phase == v1alpha1.MigrationRunning) {
		return failed(ReasonTargetPodFailed, "no target pod is recorded in the migration's status")
	}
	if obs.TargetPodCreated {
		switch pod := obs.TargetPod; {
		case pod == nil:
			return failed(ReasonTargetPodFailed, "target pod is gone")
		case pod.DeletionTimestamp != nil:
			return failed(ReasonTargetPodFailed, "target pod %s is being deleted", pod.Name)
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			return failed(ReasonTargetPodFailed, "target pod %s is %s", pod.Name, pod.Status.Phase)
		}
	}
	switch obs.Phase {
	case v1alpha1.MigrationScheduling:
		if pod := obs.TargetPod; pod != nil && pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning {
			return Decision{Phase: v1alpha1.MigrationTargetReady}
		}
		if pod := obs.TargetPod; pod != nil && pod.Spec.NodeName == "" && obs.Scheduling > TargetPodPendingTimeout {
			why := "no node can take it"
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
					why = c.Message
				}
			}
			return failed(ReasonTargetPodUnschedulable, "target pod %s was not scheduled within %s: %s", pod.Name, TargetPodPendingTimeout, why)
		}
		return Decision{Phase: v1alpha1.MigrationScheduling}
	case v1alpha1.MigrationTargetReady:
		if ours && state.StartTimestamp != nil {
			return Decision{Phase: v1alpha1.MigrationRunning}
		}
		if obs.WaitingForNode > NodeStartTimeout {
			return failed(ReasonNodeStartTimeout, "the node side did not start the migration within %s of the target pod running (is each handler up, with its node certificate?)", NodeStartTimeout)
		}
		return Decision{Phase: v1alpha1.MigrationTargetReady}
	case v1alpha1.MigrationRunning:
		if !ours {
			return failed(v1alpha1.ReasonMigrationFailed, "the VMI no longer carries this migration's state")
		}
		return Decision{Phase: v1alpha1.MigrationRunning}
	}
	// Scheduled and PreparingTarget exist in the API for KubeVirt compatibility; this controller
	// never sets them, so a migration found in one is treated as still scheduling.
	return Decision{Phase: v1alpha1.MigrationScheduling}
}

func phaseWord(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == v1alpha1.VMIPhaseUnset {
		return "without a phase"
	}
	return string(p)
}
