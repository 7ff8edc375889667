package handler

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// TestGuestAgentStatus: the handler polls the fake hypervisor's guest agent, which answers
// 300ms after the boot; the VMI's AgentConnected condition goes False then True with the
// agent's guest OS info, and the status is not published again while the agent answers the
// same, however many polls.
func TestGuestAgentStatus(t *testing.T) {
	e := newEnv(t, DriverSet{Hypervisor: fakeHV, Network: testNetwork, Storage: testStorage}, fakeManifests(t))
	e.cfg.DriverConfig = map[string]json.RawMessage{fakeHV: json.RawMessage(`{"agentDelay": "300ms"}`)}
	const poll = 50 * time.Millisecond
	e.cfg.GuestAgentPollInterval.Duration = poll
	e.cfg.ResyncPeriod.Duration = time.Hour // only the agent poller publishes
	h := e.start()
	vmi := testVMI("agent", "uid-agent", e.disk)
	mustRun(t, h, vmi)

	agentIs := func(want corev1.ConditionStatus) func(v1alpha1.VirtualMachineInstanceStatus) bool {
		return func(st v1alpha1.VirtualMachineInstanceStatus) bool {
			c := Condition(st, v1alpha1.VirtualMachineInstanceAgentConnected)
			return c != nil && c.Status == want
		}
	}
	e.rec.waitFor(t, vmi.UID, "AgentConnected", 10*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return Condition(st, v1alpha1.VirtualMachineInstanceAgentConnected) != nil
	})
	first, _ := e.rec.last(vmi.UID)
	if c := Condition(first, v1alpha1.VirtualMachineInstanceAgentConnected); c.Status != corev1.ConditionFalse || c.Reason != v1alpha1.ReasonGuestAgentNotConnected || c.Message == "" {
		t.Errorf("first AgentConnected = %+v, want False GuestAgentNotConnected with a message (the agent answers 300ms after boot)", c)
	}
	if first.GuestOSInfo != (v1alpha1.VirtualMachineInstanceGuestOSInfo{}) {
		t.Errorf("guestOSInfo before the agent answered = %+v", first.GuestOSInfo)
	}
	e.rec.waitFor(t, vmi.UID, "AgentConnected=True", 10*time.Second, agentIs(corev1.ConditionTrue))
	st, _ := e.rec.last(vmi.UID)
	want := v1alpha1.VirtualMachineInstanceGuestOSInfo{
		Name: fake.FakeGuestOS.Name, KernelRelease: fake.FakeGuestOS.KernelRelease, Version: fake.FakeGuestOS.Version,
		PrettyName: fake.FakeGuestOS.PrettyName, VersionID: fake.FakeGuestOS.VersionId,
		KernelVersion: fake.FakeGuestOS.KernelVersion, Machine: fake.FakeGuestOS.Machine, ID: fake.FakeGuestOS.Id,
	}
	if st.GuestOSInfo != want {
		t.Errorf("guestOSInfo = %+v, want %+v", st.GuestOSInfo, want)
	}
	if c := Condition(st, v1alpha1.VirtualMachineInstanceAgentConnected); c.Reason != v1alpha1.ReasonGuestAgentConnected || c.Message != "" {
		t.Errorf("AgentConnected = %+v", c)
	}

	// Twenty polls more of an agent that answers the same: nothing new is published.
	e.rec.mu.Lock()
	n := len(e.rec.seen[vmi.UID])
	e.rec.mu.Unlock()
	time.Sleep(20 * poll)
	e.rec.mu.Lock()
	after := e.rec.seen[vmi.UID][n:]
	e.rec.mu.Unlock()
	if len(after) != 0 {
		t.Errorf("%d statuses published while the agent answered the same, want none: %+v", len(after), after)
	}

	// Stopped: the condition goes, the guest OS info stays.
	stopped, err := h.Stop(t.Context(), vmi, 10*time.Second)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if c := Condition(stopped, v1alpha1.VirtualMachineInstanceAgentConnected); c != nil || stopped.GuestOSInfo != want {
		t.Errorf("after Stop: AgentConnected %+v, guestOSInfo %+v; want no condition and the last OS info", c, stopped.GuestOSInfo)
	}
}

// TestDeriveAgent: the AgentConnected condition and guestOSInfo from the driver's answers, its
// transition time kept while the answer does not change.
func TestDeriveAgent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	running := Observation{Created: true, VM: runningVM()}
	prev := DeriveStatus(v1alpha1.VirtualMachineInstanceStatus{}, running, t0)
	if c := Condition(prev, v1alpha1.VirtualMachineInstanceAgentConnected); c != nil {
		t.Fatalf("before the driver was asked: %+v, want no condition", c)
	}
	notYet := running
	notYet.Agent = agentAnswer(false)
	st := DeriveStatus(prev, notYet, t0.Add(time.Second))
	if c := Condition(st, v1alpha1.VirtualMachineInstanceAgentConnected); c == nil || c.Status != corev1.ConditionFalse || c.Message != "no answer" {
		t.Fatalf("not connected: %+v", c)
	}
	yes := running
	yes.Agent = agentAnswer(true)
	st = DeriveStatus(st, yes, t0.Add(2*time.Second))
	again := DeriveStatus(st, yes, t0.Add(3*time.Second))
	c := Condition(again, v1alpha1.VirtualMachineInstanceAgentConnected)
	if c == nil || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("connected twice: %+v, want True since the first answer", c)
	}
	if again.GuestOSInfo.ID != "debian" || again.GuestOSInfo.KernelRelease != "6.1.0-31-cloud-amd64" {
		t.Errorf("guestOSInfo = %+v", again.GuestOSInfo)
	}
	lost := DeriveStatus(again, notYet, t0.Add(4*time.Second))
	if c := Condition(lost, v1alpha1.VirtualMachineInstanceAgentConnected); c.Status != corev1.ConditionFalse || lost.GuestOSInfo.ID != "debian" {
		t.Errorf("agent lost: %+v, guestOSInfo %+v; want False and the last OS info kept", c, lost.GuestOSInfo)
	}
	unknown := yes
	unknown.Agent = nil
	if c := Condition(DeriveStatus(again, unknown, t0.Add(5*time.Second)), v1alpha1.VirtualMachineInstanceAgentConnected); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("not asked since (a handler restart): %+v, want the condition kept", c)
	}
}

func runningVM() *hypervisorv1.VMStatus { return vmIn(hypervisorv1.State_STATE_RUNNING, "Started") }

// agentAnswer is a driver's GuestAgentInfo answer: Debian 12 when connected.
func agentAnswer(connected bool) *hypervisorv1.GuestAgentInfoResponse {
	if !connected {
		return &hypervisorv1.GuestAgentInfoResponse{Message: "no answer"}
	}
	return &hypervisorv1.GuestAgentInfoResponse{Connected: true, Version: "7.2.15", Os: &hypervisorv1.GuestOSInfo{
		Name: "Debian GNU/Linux", KernelRelease: "6.1.0-31-cloud-amd64", Version: "12 (bookworm)",
		PrettyName: "Debian GNU/Linux 12 (bookworm)", VersionId: "12", Machine: "x86_64", Id: "debian",
	}}
}
