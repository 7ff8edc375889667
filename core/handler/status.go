package handler

import (
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// Reasons of the Synchronized=False condition: why the sync failed, by cause — the VMI, the
// sandbox, a driver (the step of the sync whose driver call failed), or the handler itself. The
// same strings are the reasons of the handler's Warning events.
const (
	// ReasonInvalidSpec: the VMI is inconsistent (a disk naming no volume, an interface without
	// a binding, an image not found on the node, ...); no driver was called.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonUnsupported: the VMI asks for what a configured driver does not declare in its
	// Capabilities; no driver was called.
	ReasonUnsupported = "Unsupported"
	// ReasonDriverNotFound: a driver the VMI needs is not configured, not installed or not
	// running.
	ReasonDriverNotFound = v1alpha1.ReasonDriverNotFound
	// ReasonSandboxNotReady: the VMI's sandbox (launcher, network namespace) is not there.
	ReasonSandboxNotReady = "SandboxNotReady"
	// ReasonStorageFailed: the storage driver's Prepare failed.
	ReasonStorageFailed = "StoragePrepareFailed"
	// ReasonNetworkFailed: the network driver's Setup failed.
	ReasonNetworkFailed = "NetworkSetupFailed"
	// ReasonDeviceFailed: the device driver's Allocate failed.
	ReasonDeviceFailed = "DeviceAllocateFailed"
	// ReasonDomainFailed: the domain spec could not be built from the drivers' results.
	ReasonDomainFailed = "DomainBuildFailed"
	// ReasonCreateFailed: the hypervisor driver's Create failed.
	ReasonCreateFailed = "HypervisorCreateFailed"
	// ReasonStartFailed: the hypervisor driver's Start failed.
	ReasonStartFailed = "HypervisorStartFailed"
	// ReasonSELinuxLabelFailed: the VMI's files could not be labelled with its sandbox's SELinux
	// level (or the level is not one), on a node with SELinux enabled.
	ReasonSELinuxLabelFailed = "SELinuxLabelFailed"
	// ReasonOwnerFailed: the VMI's files could not be given to its sandbox's user
	// (SandboxSpec.Owner).
	ReasonOwnerFailed = "FileOwnerFailed"
	// ReasonInternal: the handler itself failed (writing the VMI's state on the node, making
	// its run directory), not the VMI nor a driver.
	ReasonInternal = "InternalError"
)

// ReasonSandboxExited is the reason of a Failed VMI whose sandbox (the launcher holding its VM
// process) ended under it.
const ReasonSandboxExited = "LauncherExited"

// ReasonStoppedBeforeStart is the reason of a Failed VMI that was stopped before its VM ran.
const ReasonStoppedBeforeStart = "StoppedBeforeStart"

// Failure is a failed sync: the reason (Reason* constants) and the error.
type Failure struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Observation is what the handler knows of one VMI, from which DeriveStatus makes its status.
type Observation struct {
	// NodeName is the node the handler runs on.
	NodeName string
	// Failure is the last sync's failure; nil after a successful sync.
	Failure *Failure
	// Created is true once the hypervisor driver has been asked to create the VM.
	Created bool
	// VM is the VM as the hypervisor driver last reported it (Status, Recover, or an event);
	// nil when the driver has not been asked or could not be reached.
	VM *hypervisorv1.VMStatus
	// Stopping is true once Stop was asked: the VM going away is then a success, forced or
	// not.
	Stopping bool
	// Interfaces are the VMI's interfaces with the network driver's results, in spec order.
	Interfaces []InterfaceObservation
	// SandboxExited, when set, says why the sandbox that holds the VM process ended.
	SandboxExited string
	// Agent is what the hypervisor driver last said of the VM's guest agent (GuestAgentInfo);
	// nil when the driver has no guest agent or has not been asked since the VM started.
	Agent *hypervisorv1.GuestAgentInfoResponse
}

// InterfaceObservation is one interface of a VMI and what the network driver made of it.
type InterfaceObservation struct {
	Name   string
	Result *networkv1.InterfaceResult
}

// DeriveStatus returns the status of a VMI from its previous status and what the handler
// observed. It is a pure function:
//
//   - phase: Scheduled until the VM runs; Running while it runs, is paused or shuts down;
//     Succeeded once it stopped by itself (GuestShutdown), migrated, or was stopped by Stop;
//     Failed once it crashed, was killed, its process went away, or its sandbox exited.
//     Succeeded and Failed are final (only the reason of a Failed VMI can still become
//     LauncherExited, once the sandbox's end is known). While the hypervisor driver cannot be
//     reached (VM nil after Created) the phase stays what it was: a driver restart does not
//     fail a VMI;
//   - reason: the driver's reason of a Failed VM (Killed, ProcessExited, GuestPanicked, ...);
//   - conditions: Ready (True while the guest runs, False with GuestNotRunning otherwise),
//     Paused (while paused), Synchronized=False with the failed step as its reason;
//   - interfaces: name, MAC, addresses (without prefix length) and pod interface from the
//     network driver's results; nodeName; a phase transition timestamp per new phase;
//   - AgentConnected (while the VM runs or is paused, once the driver was asked of its guest
//     agent): True when the agent answered, False with GuestAgentNotConnected otherwise; gone
//     once the VM no longer runs. guestOSInfo is what a connected agent last reported, kept
//     while it is not connected and after the VM stopped.
//
// Fields the handler does not own (migration state, launcher pod name, class) are kept from
// prev.
func DeriveStatus(prev v1alpha1.VirtualMachineInstanceStatus, obs Observation, now time.Time) v1alpha1.VirtualMachineInstanceStatus {
	st := *prev.DeepCopy()
	st.NodeName = obs.NodeName
	ts := metav1.NewTime(now)

	phase, reason, vmKnown := derivePhase(prev, obs)
	if phase != prev.Phase {
		st.PhaseTransitionTimestamps = append(st.PhaseTransitionTimestamps,
			v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: ts})
	}
	st.Phase, st.Reason = phase, reason

	// Ready.
	if vmKnown || !obs.Created {
		ready := corev1.ConditionFalse
		cReason, cMessage := v1alpha1.ReasonGuestNotRunning, "the guest is not running"
		if phase == v1alpha1.Running && obs.VM.GetState() == hypervisorv1.State_STATE_RUNNING {
			ready, cReason, cMessage = corev1.ConditionTrue, "", ""
		} else if obs.VM != nil {
			cMessage = describeVM(obs.VM)
		}
		st.Conditions = v1alpha1.SetInstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceCondition{
			Type: v1alpha1.VirtualMachineInstanceReady, Status: ready, Reason: cReason, Message: cMessage,
		}, ts)
	}
	// Paused.
	if vmKnown {
		if obs.VM.GetState() == hypervisorv1.State_STATE_PAUSED && phase == v1alpha1.Running {
			st.Conditions = v1alpha1.SetInstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceCondition{
				Type: v1alpha1.VirtualMachineInstancePaused, Status: corev1.ConditionTrue,
				Reason: v1alpha1.ReasonPaused, Message: obs.VM.GetMessage(),
			}, ts)
		} else {
			st.Conditions = removeCondition(st.Conditions, v1alpha1.VirtualMachineInstancePaused)
		}
	}
	// Synchronized.
	if f := obs.Failure; f != nil {
		st.Conditions = v1alpha1.SetInstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceCondition{
			Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: corev1.ConditionFalse,
			Reason: f.Reason, Message: f.Message,
		}, ts)
	} else {
		st.Conditions = removeCondition(st.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
	}

	// AgentConnected and guestOSInfo.
	if vmKnown || !obs.Created {
		deriveAgent(&st, obs, phase, ts)
	}

	st.Interfaces = nil
	for _, i := range obs.Interfaces {
		if i.Result == nil {
			continue
		}
		ni := v1alpha1.VirtualMachineInstanceNetworkInterface{
			Name:          i.Name,
			MAC:           i.Result.GetMac(),
			InterfaceName: i.Result.GetPodInterface(),
			InfoSource:    "domain",
		}
		// Users connect to the addresses the guest is reached at: the pod's behind a NAT
		// binding (as KubeVirt reports for masquerade), else the guest's own.
		addrs := i.Result.GetReachableAddresses()
		if len(addrs) == 0 {
			addrs = i.Result.GetIpAddresses()
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a); err == nil {
				a = p.Addr().String()
			}
			ni.IPs = append(ni.IPs, a)
		}
		if len(ni.IPs) > 0 {
			ni.IP = ni.IPs[0]
		}
		st.Interfaces = append(st.Interfaces, ni)
	}
	return st
}

// deriveAgent sets the AgentConnected condition and guestOSInfo of st from obs.Agent.
func deriveAgent(st *v1alpha1.VirtualMachineInstanceStatus, obs Observation, phase v1alpha1.VirtualMachineInstancePhase, ts metav1.Time) {
	state := obs.VM.GetState()
	runs := phase == v1alpha1.Running && (state == hypervisorv1.State_STATE_RUNNING || state == hypervisorv1.State_STATE_PAUSED)
	if !runs {
		st.Conditions = removeCondition(st.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected)
		return
	}
	a := obs.Agent
	if a == nil {
		return // not asked yet (a handler restart): what the VMI shows stays
	}
	c := v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceAgentConnected, Status: corev1.ConditionFalse,
		Reason: v1alpha1.ReasonGuestAgentNotConnected, Message: orDefault(a.GetMessage(), "the guest agent does not answer"),
	}
	if a.GetConnected() {
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, v1alpha1.ReasonGuestAgentConnected, ""
		st.GuestOSInfo = GuestOSInfo(a.GetOs())
	}
	st.Conditions = v1alpha1.SetInstanceCondition(st.Conditions, c, ts)
}

// GuestOSInfo is the VMI status field of what a guest agent reported.
func GuestOSInfo(os *hypervisorv1.GuestOSInfo) v1alpha1.VirtualMachineInstanceGuestOSInfo {
	return v1alpha1.VirtualMachineInstanceGuestOSInfo{
		Name: os.GetName(), KernelRelease: os.GetKernelRelease(), Version: os.GetVersion(),
		PrettyName: os.GetPrettyName(), VersionID: os.GetVersionId(), KernelVersion: os.GetKernelVersion(),
		Machine: os.GetMachine(), ID: os.GetId(),
	}
}

// derivePhase returns the phase and reason of a VMI, and whether the VM's state is known.
func derivePhase(prev v1alpha1.VirtualMachineInstanceStatus, obs Observation) (v1alpha1.VirtualMachineInstancePhase, string, bool) {
	if obs.SandboxExited != "" && !obs.Stopping && obs.Created && prev.Phase != v1alpha1.Succeeded {
		// The VM process was the sandbox's: its end is why the VM failed, whatever the
		// hypervisor driver saw first (the process exiting).
		return v1alpha1.Failed, ReasonSandboxExited, obs.VM != nil
	}
	if final(prev.Phase) {
		return prev.Phase, prev.Reason, obs.VM != nil
	}
	vm := obs.VM
	if vm == nil && obs.Stopping && !obs.Created {
		// Stopped with nothing left on the node: a success if it ran, else it never started.
		if prev.Phase == v1alpha1.Running {
			return v1alpha1.Succeeded, "", false
		}
		return v1alpha1.Failed, ReasonStoppedBeforeStart, false
	}
	if vm == nil {
		if obs.Created && prev.Phase != "" {
			return prev.Phase, prev.Reason, false // the driver cannot say now: keep what was
		}
		return v1alpha1.Scheduled, "", false
	}
	switch vm.GetState() {
	case hypervisorv1.State_STATE_CREATED:
		return v1alpha1.Scheduled, "", true
	case hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED, hypervisorv1.State_STATE_SHUTTING_DOWN:
		return v1alpha1.Running, "", true
	case hypervisorv1.State_STATE_STOPPED:
		switch {
		case obs.Stopping, vm.GetReason() == driver.ReasonGuestShutdown, vm.GetReason() == driver.ReasonMigrated:
			return v1alpha1.Succeeded, "", true
		}
		return v1alpha1.Failed, orDefault(vm.GetReason(), "Stopped"), true
	case hypervisorv1.State_STATE_CRASHED:
		if obs.Stopping {
			return v1alpha1.Succeeded, "", true
		}
		return v1alpha1.Failed, orDefault(vm.GetReason(), "Crashed"), true
	}
	if prev.Phase != "" {
		return prev.Phase, prev.Reason, false
	}
	return v1alpha1.Scheduled, "", false
}

func final(p v1alpha1.VirtualMachineInstancePhase) bool {
	return p == v1alpha1.Succeeded || p == v1alpha1.Failed
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// describeVM says in words what state a VM is in, for a condition's message.
func describeVM(vm *hypervisorv1.VMStatus) string {
	s := "the VM is " + driver.StateWord(vm.GetState())
	if vm.GetReason() != "" {
		s += " (" + vm.GetReason() + ")"
	}
	if vm.GetMessage() != "" {
		s += ": " + vm.GetMessage()
	}
	return s
}

func removeCondition(conds []v1alpha1.VirtualMachineInstanceCondition, t v1alpha1.VirtualMachineInstanceConditionType) []v1alpha1.VirtualMachineInstanceCondition {
	return slices.DeleteFunc(conds, func(c v1alpha1.VirtualMachineInstanceCondition) bool { return c.Type == t })
}

// Condition returns the condition of type t in st, or nil.
func Condition(st v1alpha1.VirtualMachineInstanceStatus, t v1alpha1.VirtualMachineInstanceConditionType) *v1alpha1.VirtualMachineInstanceCondition {
	return v1alpha1.InstanceCondition(st.Conditions, t)
}
