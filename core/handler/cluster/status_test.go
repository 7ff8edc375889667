package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

func cond(t v1alpha1.VirtualMachineInstanceConditionType, s corev1.ConditionStatus, reason string) v1alpha1.VirtualMachineInstanceCondition {
	return v1alpha1.VirtualMachineInstanceCondition{Type: t, Status: s, Reason: reason}
}

func stamp(p v1alpha1.VirtualMachineInstancePhase) v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp {
	return v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: p}
}

// phaseOwnedBy returns managedFields in which manager owns status.phase.
func phaseOwnedBy(manager string) []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{Manager: manager, FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}}
}

// condString is "Type=Status/Reason ..." of conds, in order.
func condString(conds []v1alpha1.VirtualMachineInstanceCondition) string {
	var parts []string
	for _, c := range conds {
		parts = append(parts, string(c.Type)+"="+string(c.Status)+"/"+c.Reason)
	}
	return strings.Join(parts, " ")
}

func TestHandlerStatus(t *testing.T) {
	me := v1alpha1.HandlerFieldManager(node)
	controller := v1alpha1.VMIControllerFieldManager
	stored := func(phase v1alpha1.VirtualMachineInstancePhase, owner string, mut ...func(*v1alpha1.VirtualMachineInstanceStatus)) *v1alpha1.VirtualMachineInstance {
		vmi := &v1alpha1.VirtualMachineInstance{}
		if owner != "" {
			vmi.ManagedFields = phaseOwnedBy(owner)
		}
		vmi.Status = v1alpha1.VirtualMachineInstanceStatus{
			Phase: phase, NodeName: node, HypervisorClassName: "qemu", LauncherPodName: "launcher",
			PhaseTransitionTimestamps: []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{stamp(v1alpha1.Pending), stamp(v1alpha1.Scheduled)},
			Conditions: []v1alpha1.VirtualMachineInstanceCondition{
				cond("PodScheduled", corev1.ConditionTrue, ""),
				cond(v1alpha1.VirtualMachineInstanceReady, corev1.ConditionFalse, v1alpha1.ReasonPodFailed),
			},
		}
		for _, m := range mut {
			m(&vmi.Status)
		}
		return vmi
	}
	nodeSt := v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: node,
		PhaseTransitionTimestamps: []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{stamp(v1alpha1.Pending), stamp(v1alpha1.Scheduled), stamp(v1alpha1.Running)},
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{
			cond("PodScheduled", corev1.ConditionTrue, ""), // kept by the handler from what it read: not its own
			cond(v1alpha1.VirtualMachineInstanceReady, corev1.ConditionTrue, ""),
			cond(v1alpha1.VirtualMachineInstanceSynchronized, corev1.ConditionFalse, v1alpha1.ReasonSyncFailed),
		},
		Interfaces: []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.244.0.5"}},
	}
	for _, tt := range []struct {
		name                      string
		stored                    *v1alpha1.VirtualMachineInstance
		node                      v1alpha1.VirtualMachineInstanceStatus
		phase                     v1alpha1.VirtualMachineInstancePhase
		conds                     string
		stamps                    int
		lifecycle, takeOver, rels bool
		interfaces                int
	}{
		{name: "first write: takes the lifecycle over from the VMI controller", stored: stored(v1alpha1.Scheduled, controller), node: nodeSt,
			phase: v1alpha1.Running, conds: "Ready=True/ Synchronized=False/SyncFailed", stamps: 3, lifecycle: true, takeOver: true, interfaces: 1},
		{name: "its own lifecycle: written without taking anything over", stored: stored(v1alpha1.Scheduled, me), node: nodeSt,
			phase: v1alpha1.Running, conds: "Ready=True/ Synchronized=False/SyncFailed", stamps: 3, lifecycle: true, interfaces: 1},
		{name: "handler behind the API: the phase does not move back", stored: stored(v1alpha1.Running, me), node: withPhase(nodeSt, v1alpha1.Scheduled),
			phase: v1alpha1.Running, conds: "Ready=True/ Synchronized=False/SyncFailed", stamps: 2, lifecycle: true, interfaces: 1},
		{name: "final, taken back by the VMI controller: left to it", stored: stored(v1alpha1.Failed, controller), node: nodeSt,
			conds: "", lifecycle: false, interfaces: 1},
		{name: "final, its own: written as stored, the interfaces refreshed", stored: stored(v1alpha1.Succeeded, me), node: nodeSt,
			phase: v1alpha1.Succeeded, conds: "Ready=False/PodFailed", stamps: 2, lifecycle: true, interfaces: 1},
		{name: "an empty handler status takes nothing over", stored: stored(v1alpha1.Scheduled, controller), node: v1alpha1.VirtualMachineInstanceStatus{}},
		{name: "an empty handler status keeps its own lifecycle as stored", stored: stored(v1alpha1.Running, me), node: v1alpha1.VirtualMachineInstanceStatus{},
			phase: v1alpha1.Running, conds: "Ready=False/PodFailed", stamps: 2, lifecycle: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.stored.DeepCopy()
			w := handlerStatus(tt.stored, tt.node, me)
			if w.Status.Phase != tt.phase || condString(w.Status.Conditions) != tt.conds || len(w.Status.PhaseTransitionTimestamps) != tt.stamps ||
				w.Lifecycle != tt.lifecycle || w.TakeOver != tt.takeOver || w.Release != tt.rels || len(w.Status.Interfaces) != tt.interfaces {
				t.Errorf("got phase %q conditions %q %d timestamps lifecycle %v take over %v release %v %d interfaces; want %q %q %d %v %v %v %d",
					w.Status.Phase, condString(w.Status.Conditions), len(w.Status.PhaseTransitionTimestamps), w.Lifecycle, w.TakeOver, w.Release, len(w.Status.Interfaces),
					tt.phase, tt.conds, tt.stamps, tt.lifecycle, tt.takeOver, tt.rels, tt.interfaces)
			}
			if w.Status.NodeName != "" || w.Status.HypervisorClassName != "" || w.Status.LauncherPodName != "" {
				t.Errorf("writes the VMI controller's fields: %+v", w.Status)
			}
			if before.Status.Phase != tt.stored.Status.Phase || len(before.Status.Conditions) != len(tt.stored.Status.Conditions) {
				t.Error("handlerStatus changed its input")
			}
		})
	}
	// A handler that still shares what the VMI controller took back gives it up.
	shared := stored(v1alpha1.Failed, controller)
	shared.ManagedFields = append(shared.ManagedFields, phaseOwnedBy(me)...)
	if w := handlerStatus(shared, nodeSt, me); w.Lifecycle || !w.Release {
		t.Errorf("shared final lifecycle: lifecycle %v release %v, want false true", w.Lifecycle, w.Release)
	}
}

func withPhase(st v1alpha1.VirtualMachineInstanceStatus, p v1alpha1.VirtualMachineInstancePhase) v1alpha1.VirtualMachineInstanceStatus {
	st.Phase = p
	return st
}

// TestWriteStatus runs writeStatus against a real API server, the VMI controller played by
// applies under its field manager: the handler takes the lifecycle fields over with its first
// write and leaves the controller's fields as they are; once the controller has ended the VMI,
// the handler's writes change neither the phase nor anything else the controller owns.
func TestWriteStatus(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	c := env.Client
	a := &Agent{client: c, cfg: AgentConfig{NodeName: node}}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "default"}}
	if err := c.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	controller := func(st v1alpha1.VirtualMachineInstanceStatus, force bool) {
		t.Helper()
		body, err := v1alpha1.StatusApply(vmi, &st, "")
		if err != nil {
			t.Fatal(err)
		}
		opts := []client.SubResourceApplyOption{client.FieldOwner(v1alpha1.VMIControllerFieldManager)}
		if force {
			opts = append(opts, client.ForceOwnership)
		}
		if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body), opts...); err != nil {
			t.Fatalf("the VMI controller's apply: %v", err)
		}
	}
	get := func() *v1alpha1.VirtualMachineInstance {
		t.Helper()
		got := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	t0 := metav1.NewTime(time.Now().Truncate(time.Second))
	ctrlFields := v1alpha1.VirtualMachineInstanceStatus{
		NodeName: node, HypervisorClassName: "qemu", LauncherPodName: "launcher",
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: "PodScheduled", Status: corev1.ConditionTrue, LastTransitionTime: t0}},
	}
	scheduled := *ctrlFields.DeepCopy()
	scheduled.Phase = v1alpha1.Scheduled
	scheduled.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{{Phase: v1alpha1.Scheduled, PhaseTransitionTimestamp: t0}}
	controller(scheduled, false)

	running := v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: node,
		PhaseTransitionTimestamps: []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{{Phase: v1alpha1.Running, PhaseTransitionTimestamp: t0}},
		Conditions:                []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: t0}},
		Interfaces:                []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.244.0.5"}},
	}
	if err := a.writeStatus(ctx, client.ObjectKeyFromObject(vmi), running); err != nil {
		t.Fatal(err)
	}
	got := get()
	if got.Status.Phase != v1alpha1.Running || len(got.Status.PhaseTransitionTimestamps) != 2 || len(got.Status.Interfaces) != 1 ||
		got.Status.HypervisorClassName != "qemu" || got.Status.LauncherPodName != "launcher" || v1alpha1.InstanceCondition(got.Status.Conditions, "PodScheduled") == nil {
		t.Errorf("after the handler's first write: %+v", got.Status)
	}
	if !v1alpha1.HoldsLifecycle(got, v1alpha1.HandlerFieldManager(node)) || v1alpha1.SharesLifecycle(got, v1alpha1.VMIControllerFieldManager) {
		t.Errorf("managed fields %+v: want the lifecycle the handler's alone", got.ManagedFields)
	}
	// The controller's next apply leaves the lifecycle out; the handler's fields stay.
	controller(ctrlFields, false)
	if got := get(); got.Status.Phase != v1alpha1.Running || len(got.Status.Interfaces) != 1 {
		t.Errorf("after the controller's apply without the lifecycle: %+v", got.Status)
	}

	// The launcher pod went away: the VMI controller ends the VMI, taking the lifecycle back.
	failed := *ctrlFields.DeepCopy()
	failed.Phase, failed.Reason = v1alpha1.Failed, v1alpha1.ReasonPodNotExists
	failed.PhaseTransitionTimestamps = append(get().Status.PhaseTransitionTimestamps, v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: v1alpha1.Failed, PhaseTransitionTimestamp: t0})
	failed.Conditions = append(failed.Conditions, v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonPodNotExists, Message: "gone", LastTransitionTime: t0,
	})
	controller(failed, true)
	// The handler, behind, still has it Running, then Succeeded.
	for _, phase := range []v1alpha1.VirtualMachineInstancePhase{v1alpha1.Running, v1alpha1.Succeeded} {
		if err := a.writeStatus(ctx, client.ObjectKeyFromObject(vmi), withPhase(running, phase)); err != nil {
			t.Fatalf("write %s after the VMI failed: %v", phase, err)
		}
		got = get()
		if got.Status.Phase != v1alpha1.Failed || got.Status.Reason != v1alpha1.ReasonPodNotExists {
			t.Errorf("after the handler wrote %s: phase %s reason %s, want Failed PodNotExists", phase, got.Status.Phase, got.Status.Reason)
		}
		if c := v1alpha1.InstanceCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Reason != v1alpha1.ReasonPodNotExists {
			t.Errorf("Ready %+v, want the controller's", c)
		}
	}
	if !v1alpha1.HoldsLifecycle(got, v1alpha1.VMIControllerFieldManager) || v1alpha1.SharesLifecycle(got, v1alpha1.HandlerFieldManager(node)) {
		t.Errorf("managed fields %+v: want the lifecycle the VMI controller's alone", got.ManagedFields)
	}
}

// TestWriteGuestAgentStatus: the handler's guestOSInfo and AgentConnected condition reach the
// API server with one write, a second write of the same status (the next poll of an agent
// that answers the same) changes nothing (the resourceVersion stays), and a change is written.
func TestWriteGuestAgentStatus(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	c := env.Client
	a := &Agent{client: c, cfg: AgentConfig{NodeName: node}}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "ga", Namespace: "default"}}
	if err := c.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	get := func() *v1alpha1.VirtualMachineInstance {
		t.Helper()
		got := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	t0 := metav1.NewTime(time.Now().Truncate(time.Second))
	osInfo := v1alpha1.VirtualMachineInstanceGuestOSInfo{
		Name: "Debian GNU/Linux", KernelRelease: "6.1.0-31-cloud-amd64", Version: "12 (bookworm)",
		PrettyName: "Debian GNU/Linux 12 (bookworm)", VersionID: "12", KernelVersion: "#1 SMP", Machine: "x86_64", ID: "debian",
	}
	running := v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: node,
		PhaseTransitionTimestamps: []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{{Phase: v1alpha1.Running, PhaseTransitionTimestamp: t0}},
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{
			{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: t0},
			{Type: v1alpha1.VirtualMachineInstanceAgentConnected, Status: corev1.ConditionTrue, Reason: v1alpha1.ReasonGuestAgentConnected, LastTransitionTime: t0},
		},
		GuestOSInfo: osInfo,
	}
	if err := a.writeStatus(ctx, client.ObjectKeyFromObject(vmi), running); err != nil {
		t.Fatal(err)
	}
	got := get()
	if got.Status.GuestOSInfo != osInfo {
		t.Errorf("guestOSInfo = %+v, want %+v", got.Status.GuestOSInfo, osInfo)
	}
	if cnd := v1alpha1.InstanceCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected); cnd == nil || cnd.Status != corev1.ConditionTrue {
		t.Errorf("AgentConnected = %+v", cnd)
	}
	if owners := v1alpha1.FieldManagers(got, "f:status", "f:guestOSInfo", "f:id"); len(owners) != 1 || owners[0] != v1alpha1.HandlerFieldManager(node) {
		t.Errorf("guestOSInfo.id owned by %v, want the handler alone", owners)
	}
	rv := got.ResourceVersion
	for range 3 {
		if err := a.writeStatus(ctx, client.ObjectKeyFromObject(vmi), running); err != nil {
			t.Fatal(err)
		}
	}
	if again := get(); again.ResourceVersion != rv {
		t.Errorf("the same status written again changed the VMI (resourceVersion %s, was %s): %+v", again.ResourceVersion, rv, again.Status)
	}

	lost := *running.DeepCopy()
	lost.Conditions[1] = v1alpha1.VirtualMachineInstanceCondition{Type: v1alpha1.VirtualMachineInstanceAgentConnected, Status: corev1.ConditionFalse,
		Reason: v1alpha1.ReasonGuestAgentNotConnected, Message: "the guest agent does not answer", LastTransitionTime: t0}
	if err := a.writeStatus(ctx, client.ObjectKeyFromObject(vmi), lost); err != nil {
		t.Fatal(err)
	}
	got = get()
	if cnd := v1alpha1.InstanceCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected); got.ResourceVersion == rv || cnd == nil || cnd.Status != corev1.ConditionFalse || got.Status.GuestOSInfo != osInfo {
		t.Errorf("after the agent was lost: rv %s (was %s), AgentConnected %+v, guestOSInfo %+v", got.ResourceVersion, rv, cnd, got.Status.GuestOSInfo)
	}
}
