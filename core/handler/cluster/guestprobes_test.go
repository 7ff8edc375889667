package cluster

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler/cluster/guestprobe"
)

// TestProbeChecksAllowOnlyTheVMIsProbes: the guest probe socket answers a ping only for a VMI
// with a guestAgentPing probe and runs only the exact commands of its exec probes.
func TestProbeChecksAllowOnlyTheVMIsProbes(t *testing.T) {
	exec := func(cmd ...string) *v1alpha1.Probe {
		return &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}}
	}
	ping := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
	tcp := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}}
	for _, tc := range []struct {
		name      string
		liveness  *v1alpha1.Probe
		readiness *v1alpha1.Probe
		req       guestprobe.Request
		refused   string // "" allowed, else part of the reason
	}{
		{"ping with a ping probe", nil, ping, guestprobe.Request{Ping: true}, ""},
		{"ping with exec probes only", exec("true"), tcp, guestprobe.Request{Ping: true}, "no guestAgentPing probe"},
		{"the liveness command", exec("cat", "/proc/uptime"), ping, guestprobe.Request{Command: []string{"cat", "/proc/uptime"}}, ""},
		{"the readiness command", exec("true"), exec("test", "-f", "/ready"), guestprobe.Request{Command: []string{"test", "-f", "/ready"}}, ""},
		{"another argument", exec("cat", "/proc/uptime"), nil, guestprobe.Request{Command: []string{"cat", "/etc/shadow"}}, "is not the exec command"},
		{"a prefix of the command", exec("cat", "/proc/uptime"), nil, guestprobe.Request{Command: []string{"cat"}}, "is not the exec command"},
		{"no probes", nil, nil, guestprobe.Request{Command: []string{"true"}}, "is not the exec command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := checksOf(tc.liveness, tc.readiness).allows(tc.req)
			switch {
			case tc.refused == "" && why != "":
				t.Errorf("refused: %s", why)
			case tc.refused != "" && !strings.Contains(why, tc.refused):
				t.Errorf("reason %q, want one with %q", why, tc.refused)
			}
		})
	}
}
