package v1alpha1

import "slices"

// phaseOrder is the order of the phases a VMI moves through before it ends (Succeeded or
// Failed, both final).
var phaseOrder = []VirtualMachineInstancePhase{Pending, Scheduling, Scheduled, Running}

// IsFinal reports whether p is Succeeded or Failed: nothing but deletion follows it.
func (p VirtualMachineInstancePhase) IsFinal() bool {
	return p == Succeeded || p == Failed
}

// CanMoveTo reports whether a VMI in phase p may be written with phase q: a phase never moves
// back (Pending, Scheduling, Scheduled, Running, then Succeeded or Failed), a final phase never
// changes, and Unknown may come and go before the end. The API server enforces the same rule on
// every write of VMI status (the CRD's x-kubernetes-validations), so that no writer
// can undo another's progress; writers ask CanMoveTo so as not to send what it refuses.
func (p VirtualMachineInstancePhase) CanMoveTo(q VirtualMachineInstancePhase) bool {
	switch {
	case p == q || p == VMIPhaseUnset:
		return true
	case p.IsFinal() || q == VMIPhaseUnset:
		return false
	case q.IsFinal() || q == Unknown:
		return true
	}
	return slices.Index(phaseOrder, q) > slices.Index(phaseOrder, p)
}
