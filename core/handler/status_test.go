package handler

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

func vmIn(state hypervisorv1.State, reason string) *hypervisorv1.VMStatus {
	return &hypervisorv1.VMStatus{Id: "u", State: state, Reason: reason}
}

func TestDeriveStatus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	running := v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running,
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{
			{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0)},
		},
	}
	tests := []struct {
		name       string
		prev       v1alpha1.VirtualMachineInstanceStatus
		obs        Observation
		phase      v1alpha1.VirtualMachineInstancePhase
		reason     string
		ready      corev1.ConditionStatus // "" for no Ready condition
		paused     bool
		syncReason string // reason of Synchronized=False, "" for none
	}{
		{name: "nothing yet", obs: Observation{}, phase: v1alpha1.Scheduled, ready: corev1.ConditionFalse},
		{name: "created", obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_CREATED, driver.ReasonCreated)}, phase: v1alpha1.Scheduled, ready: corev1.ConditionFalse},
		{name: "running", obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_RUNNING, driver.ReasonStarted)}, phase: v1alpha1.Running, ready: corev1.ConditionTrue},
		{name: "paused", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_PAUSED, driver.ReasonPaused)}, phase: v1alpha1.Running, ready: corev1.ConditionFalse, paused: true},
		{name: "shutting down", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_SHUTTING_DOWN, driver.ReasonPowerdownRequested)}, phase: v1alpha1.Running, ready: corev1.ConditionFalse},
		{name: "guest shut down", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonGuestShutdown)}, phase: v1alpha1.Succeeded, ready: corev1.ConditionFalse},
		{name: "migrated", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrated)}, phase: v1alpha1.Succeeded, ready: corev1.ConditionFalse},
		{name: "killed", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonKilled)}, phase: v1alpha1.Failed, reason: driver.ReasonKilled, ready: corev1.ConditionFalse},
		{name: "forced by Stop", prev: running, obs: Observation{Created: true, Stopping: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonForcedShutdown)}, phase: v1alpha1.Succeeded, ready: corev1.ConditionFalse},
		{name: "forced without Stop", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonForcedShutdown)}, phase: v1alpha1.Failed, reason: driver.ReasonForcedShutdown, ready: corev1.ConditionFalse},
		{name: "process exited", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessExited)}, phase: v1alpha1.Failed, reason: driver.ReasonProcessExited, ready: corev1.ConditionFalse},
		{name: "gone at recover", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessGone)}, phase: v1alpha1.Failed, reason: driver.ReasonProcessGone, ready: corev1.ConditionFalse},
		{name: "crashed", prev: running, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_CRASHED, driver.ReasonGuestPanicked)}, phase: v1alpha1.Failed, reason: driver.ReasonGuestPanicked, ready: corev1.ConditionFalse},
		{name: "driver unreachable keeps Running and Ready", prev: running, obs: Observation{Created: true}, phase: v1alpha1.Running, ready: corev1.ConditionTrue},
		{name: "sandbox exited", prev: running, obs: Observation{Created: true, SandboxExited: "killed", VM: vmIn(hypervisorv1.State_STATE_RUNNING, "")}, phase: v1alpha1.Failed, reason: ReasonSandboxExited, ready: corev1.ConditionFalse},
		{name: "the sandbox's end explains a failure", prev: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Failed, Reason: driver.ReasonProcessExited}, obs: Observation{Created: true, SandboxExited: "killed", VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessExited)}, phase: v1alpha1.Failed, reason: ReasonSandboxExited, ready: corev1.ConditionFalse},
		{name: "the sandbox's end after a success", prev: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Succeeded}, obs: Observation{Created: true, SandboxExited: "exited", VM: vmIn(hypervisorv1.State_STATE_STOPPED, driver.ReasonGuestShutdown)}, phase: v1alpha1.Succeeded, ready: corev1.ConditionFalse},
		{name: "final stays final", prev: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Failed, Reason: driver.ReasonKilled}, obs: Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_RUNNING, "")}, phase: v1alpha1.Failed, reason: driver.ReasonKilled, ready: corev1.ConditionFalse},
		{name: "sync failed", obs: Observation{Failure: &Failure{Reason: ReasonStorageFailed, Message: "boom"}}, phase: v1alpha1.Scheduled, ready: corev1.ConditionFalse, syncReason: ReasonStorageFailed},
		{name: "stopped before it ran", obs: Observation{Stopping: true, Failure: &Failure{Reason: ReasonInvalidSpec, Message: "x"}}, phase: v1alpha1.Failed, reason: ReasonStoppedBeforeStart, ready: corev1.ConditionFalse, syncReason: ReasonInvalidSpec},
		{name: "stopped after it ran, nothing left", prev: running, obs: Observation{Stopping: true}, phase: v1alpha1.Succeeded, ready: corev1.ConditionFalse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(time.Minute)
			st := DeriveStatus(tt.prev, tt.obs, now)
			if st.Phase != tt.phase || st.Reason != tt.reason {
				t.Errorf("phase, reason = %s, %q; want %s, %q", st.Phase, st.Reason, tt.phase, tt.reason)
			}
			ready := Condition(st, v1alpha1.VirtualMachineInstanceReady)
			switch {
			case tt.ready == "" && ready != nil:
				t.Errorf("Ready = %+v, want none", ready)
			case tt.ready != "" && (ready == nil || ready.Status != tt.ready):
				t.Errorf("Ready = %+v, want %s", ready, tt.ready)
			case ready != nil && ready.Status == corev1.ConditionFalse && ready.Reason != v1alpha1.ReasonGuestNotRunning:
				t.Errorf("Ready reason = %q", ready.Reason)
			}
			if p := Condition(st, v1alpha1.VirtualMachineInstancePaused); (p != nil) != tt.paused {
				t.Errorf("Paused = %+v, want %v", p, tt.paused)
			}
			sc := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
			switch {
			case tt.syncReason == "" && sc != nil:
				t.Errorf("Synchronized = %+v, want none", sc)
			case tt.syncReason != "" && (sc == nil || sc.Status != corev1.ConditionFalse || sc.Reason != tt.syncReason || sc.Message == ""):
				t.Errorf("Synchronized = %+v, want False/%s", sc, tt.syncReason)
			}
			if tt.phase != tt.prev.Phase {
				n := len(st.PhaseTransitionTimestamps)
				if n == 0 || st.PhaseTransitionTimestamps[n-1].Phase != tt.phase || !st.PhaseTransitionTimestamps[n-1].PhaseTransitionTimestamp.Time.Equal(now) {
					t.Errorf("phase transitions = %+v", st.PhaseTransitionTimestamps)
				}
			} else if len(st.PhaseTransitionTimestamps) != len(tt.prev.PhaseTransitionTimestamps) {
				t.Errorf("a transition was added without a phase change: %+v", st.PhaseTransitionTimestamps)
			}
		})
	}
}

func TestDeriveStatusKeepsTransitionTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	obs := Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_RUNNING, "")}
	first := DeriveStatus(v1alpha1.VirtualMachineInstanceStatus{LauncherPodName: "pod", HypervisorClassName: "qemu"}, obs, t0)
	second := DeriveStatus(first, obs, t0.Add(time.Hour))
	if r := Condition(second, v1alpha1.VirtualMachineInstanceReady); !r.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready transition moved to %v", r.LastTransitionTime)
	}
	if second.LauncherPodName != "pod" || second.HypervisorClassName != "qemu" {
		t.Errorf("fields the handler does not own were lost: %+v", second)
	}
	paused := DeriveStatus(second, Observation{Created: true, VM: vmIn(hypervisorv1.State_STATE_PAUSED, "")}, t0.Add(2*time.Hour))
	if r := Condition(paused, v1alpha1.VirtualMachineInstanceReady); !r.LastTransitionTime.Time.Equal(t0.Add(2 * time.Hour)) {
		t.Errorf("Ready transition = %v, want the pause", r.LastTransitionTime)
	}
}

func TestDeriveStatusInterfaces(t *testing.T) {
	st := DeriveStatus(v1alpha1.VirtualMachineInstanceStatus{}, Observation{
		NodeName: "node-1",
		Interfaces: []InterfaceObservation{
			{Name: "default", Result: &networkv1.InterfaceResult{Name: "default", Mac: "02:00:00:00:00:01", IpAddresses: []string{"10.244.0.5/24", "fd00::5/64"}, PodInterface: "eth0"}},
			{Name: "secondary", Result: &networkv1.InterfaceResult{Name: "secondary", Mac: "02:00:00:00:00:02", PodInterface: "net1"}},
			{Name: "not-set-up"},
			// Behind NAT the guest has 10.0.2.2 and is reached at the pod's address.
			{Name: "nat", Result: &networkv1.InterfaceResult{Name: "nat", Mac: "02:00:00:00:00:03", IpAddresses: []string{"10.0.2.2/24"}, ReachableAddresses: []string{"10.244.0.6/24"}, PodInterface: "eth1"}},
		},
	}, time.Now())
	want := []v1alpha1.VirtualMachineInstanceNetworkInterface{
		{Name: "default", MAC: "02:00:00:00:00:01", IP: "10.244.0.5", IPs: []string{"10.244.0.5", "fd00::5"}, InterfaceName: "eth0", InfoSource: "domain"},
		{Name: "secondary", MAC: "02:00:00:00:00:02", InterfaceName: "net1", InfoSource: "domain"},
		{Name: "nat", MAC: "02:00:00:00:00:03", IP: "10.244.0.6", IPs: []string{"10.244.0.6"}, InterfaceName: "eth1", InfoSource: "domain"},
	}
	if len(st.Interfaces) != len(want) {
		t.Fatalf("interfaces = %+v", st.Interfaces)
	}
	for i := range want {
		got := st.Interfaces[i]
		if got.Name != want[i].Name || got.MAC != want[i].MAC || got.IP != want[i].IP || len(got.IPs) != len(want[i].IPs) ||
			got.InterfaceName != want[i].InterfaceName || got.InfoSource != want[i].InfoSource {
			t.Errorf("interface %d = %+v, want %+v", i, got, want[i])
		}
	}
	if st.NodeName != "node-1" {
		t.Errorf("nodeName = %q", st.NodeName)
	}
}

func TestNodeLabels(t *testing.T) {
	labels, problems := NodeLabels([]DriverFingerprint{
		{Kind: "hypervisor", Name: "qmp", Fingerprint: &basev1.FingerprintResponse{
			Health:     basev1.Health_HEALTH_DEGRADED,
			Attributes: map[string]string{"accel": "tcg", "qemu-version": "9.2", "bad value": "x", "note": "not a label value!"},
		}, Capabilities: &basev1.Capabilities{Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_MIGRATE}, MigrationDisks: true, MigrationPostCopy: true}},
		// Migrates memory, copies no disk, no post-copy.
		{Kind: "hypervisor", Name: "lv", Fingerprint: &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY},
			Capabilities: &basev1.Capabilities{Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_MIGRATE}}},
		// A driver without migration; its attribute of the label's name does not say otherwise.
		{Kind: "hypervisor", Name: "sim", Fingerprint: &basev1.FingerprintResponse{
			Health: basev1.Health_HEALTH_HEALTHY, Attributes: map[string]string{"live-migration": "true"},
		}, Capabilities: &basev1.Capabilities{Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_CONSOLE}}},
		// Not loaded: nothing is known of its features.
		{Kind: "hypervisor", Name: "gone"},
		{Kind: "network", Name: "cni", Fingerprint: &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY, Attributes: map[string]string{"bindings": "bridge.masquerade"}}},
		{Kind: "storage", Name: "local", Fingerprint: &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_UNHEALTHY}},
		{Kind: "device", Name: "vfio"},
	})
	want := map[string]string{
		"capability.kubevisor.io/hypervisor.qmp":               HealthDegraded,
		"capability.kubevisor.io/qmp.accel":                    "tcg",
		"capability.kubevisor.io/qmp.qemu-version":             "9.2",
		"capability.kubevisor.io/qmp.live-migration":           "true",
		"capability.kubevisor.io/qmp.live-migration-disks":     "true",
		"capability.kubevisor.io/qmp.live-migration-post-copy": "true",
		"capability.kubevisor.io/hypervisor.lv":                HealthHealthy,
		"capability.kubevisor.io/lv.live-migration":            "true",
		"capability.kubevisor.io/lv.live-migration-disks":      "false",
		"capability.kubevisor.io/lv.live-migration-post-copy":  "false",
		"capability.kubevisor.io/hypervisor.sim":               HealthHealthy,
		"capability.kubevisor.io/sim.live-migration":           "false",
		"capability.kubevisor.io/hypervisor.gone":              HealthUnhealthy,
		"capability.kubevisor.io/network.cni":                  HealthHealthy,
		"capability.kubevisor.io/cni.bindings":                 "bridge.masquerade",
		"capability.kubevisor.io/storage.local":                HealthUnhealthy,
		"capability.kubevisor.io/device.vfio":                  HealthUnhealthy,
	}
	if len(labels) != len(want) {
		t.Errorf("labels = %v, want %v", labels, want)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if len(problems) != 2 {
		t.Errorf("problems = %q, want the two bad attributes", problems)
	}
}

// TestNewProblems: the node labeler polls NodeLabels every few seconds; an unpublishable
// attribute is warned about when it appears, not on every poll.
func TestNewProblems(t *testing.T) {
	if got := newProblems(nil, []string{"a", "b"}); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("first poll: %v", got)
	}
	if got := newProblems([]string{"b", "a"}, []string{"a", "b"}); len(got) != 0 {
		t.Errorf("same problems in another order: %v, want none", got)
	}
	if got := newProblems([]string{"a"}, []string{"a", "c"}); !slices.Equal(got, []string{"c"}) {
		t.Errorf("one new problem: %v", got)
	}
}
