package cluster

import (
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// handlerConditions are the VMI condition types the node handler owns once the VMI is on its
// node; the control plane owns the others.
var handlerConditions = map[v1alpha1.VirtualMachineInstanceConditionType]bool{
	v1alpha1.VirtualMachineInstanceReady:        true,
	v1alpha1.VirtualMachineInstancePaused:       true,
	v1alpha1.VirtualMachineInstanceSynchronized: true,
}

// phaseRank orders the phases a VMI moves through; a writer never moves a VMI back.
func phaseRank(p v1alpha1.VirtualMachineInstancePhase) int {
	switch p {
	case v1alpha1.Pending:
		return 1
	case v1alpha1.Scheduling:
		return 2
	case v1alpha1.Scheduled:
		return 3
	case v1alpha1.Running:
		return 4
	case v1alpha1.Succeeded, v1alpha1.Failed:
		return 5
	}
	return 0
}

// MergeStatus returns the VMI status to write to the API: the stored one (api) with what the
// node handler derived (node) laid over the fields the handler owns — phase and reason (never
// moving back, never leaving a final phase), the handler's conditions, interfaces, node name.
// Conditions of the control plane stay as they are.
func MergeStatus(api, node v1alpha1.VirtualMachineInstanceStatus) v1alpha1.VirtualMachineInstanceStatus {
	out := *api.DeepCopy()
	final := phaseRank(api.Phase) == 5
	if !final && phaseRank(node.Phase) >= phaseRank(api.Phase) && node.Phase != "" {
		out.Phase, out.Reason = node.Phase, node.Reason
	}
	if final {
		// The control plane or an earlier write ended the VMI: only what the node still knows
		// of its interfaces is refreshed.
		if len(node.Interfaces) > 0 {
			out.Interfaces = node.Interfaces
		}
		return out
	}
	var conds []v1alpha1.VirtualMachineInstanceCondition
	for _, c := range api.Conditions {
		if !handlerConditions[c.Type] {
			conds = append(conds, c)
		}
	}
	for _, c := range node.Conditions {
		if handlerConditions[c.Type] {
			conds = append(conds, c)
		}
	}
	out.Conditions = conds
	out.Interfaces = node.Interfaces
	if node.NodeName != "" {
		out.NodeName = node.NodeName
	}
	return out
}
