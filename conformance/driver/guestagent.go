package conformance

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// agentWithin is how long after the guest says its agent runs GuestAgentPing must answer
// connected.
const agentWithin = 30 * time.Second

// guestExecTimeout is the timeout the check gives each GuestAgentExec.
const guestExecTimeout = 20 * time.Second

// checkGuestAgentPingExec: in a guest whose agent runs (Guest.AgentMarker), GuestAgentPing
// answers connected; GuestAgentExec runs `cat /proc/uptime` (exit 0, the guest's uptime on
// stdout) and `sh -c 'echo out; echo err >&2; exit 3'` (exit 3, both outputs) in the guest, and a
// command still running at its timeout is answered not exited, within about that timeout;
// GuestAgentInfo, when declared, is connected too.
func (s *vmSuite) checkGuestAgentPingExec(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	if s.guest.AgentMarker == "" {
		t.Skipf("the guest does not say whether its guest agent runs (Guest.AgentMarker)")
	}
	vm := s.boot(t, "")
	ge := optional[driver.GuestExecer](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	lines := markerLines(vm.console.out.String(), s.guest.AgentMarker)
	if len(lines) == 0 || lines[len(lines)-1] == "none" {
		t.Fatalf("the guest found no guest agent channel (%q lines: %q): a driver declaring FEATURE_HYPERVISOR_GUEST_EXEC gives every VM one", s.guest.AgentMarker, lines)
	}
	ctx := s.ctx(t)
	pctx, cancel := context.WithTimeout(ctx, agentWithin)
	defer cancel()
	var ping *hypervisorv1.GuestAgentPingResponse
	var pingErr error
	if !poll(pctx, func() bool {
		ping, pingErr = ge.GuestAgentPing(ctx, vm.id)
		return pingErr == nil && ping.GetConnected()
	}) {
		t.Fatalf("GuestAgentPing %s after the guest's %q: %v, %s", agentWithin, lines[len(lines)-1], ping, describe(pingErr))
	}
	exec := func(timeout time.Duration, command ...string) *hypervisorv1.GuestAgentExecResponse {
		t.Helper()
		begin := time.Now()
		r, err := ge.GuestAgentExec(ctx, vm.id, command, timeout)
		if err != nil {
			t.Fatalf("GuestAgentExec %q: %s", command, describe(err))
		}
		if took := time.Since(begin); took > timeout+5*time.Second {
			t.Errorf("GuestAgentExec %q took %s, more than its timeout %s", command, took.Round(time.Millisecond), timeout)
		}
		return r
	}
	up := exec(guestExecTimeout, "cat", "/proc/uptime")
	var secs float64
	if _, err := fmt.Sscanf(string(up.GetStdout()), "%f", &secs); !up.GetExited() || up.GetExitCode() != 0 || err != nil || secs <= 0 {
		t.Errorf("cat /proc/uptime: exited %v, status %d, stdout %q, message %q; want status 0 and the guest's uptime",
			up.GetExited(), up.GetExitCode(), up.GetStdout(), up.GetMessage())
	}
	r := exec(guestExecTimeout, "sh", "-c", "echo out; echo err >&2; exit 3")
	if !r.GetExited() || r.GetExitCode() != 3 || strings.TrimSpace(string(r.GetStdout())) != "out" || strings.TrimSpace(string(r.GetStderr())) != "err" {
		t.Errorf("sh -c 'echo out; echo err >&2; exit 3': exited %v, status %d, stdout %q, stderr %q, message %q; want status 3, out and err",
			r.GetExited(), r.GetExitCode(), r.GetStdout(), r.GetStderr(), r.GetMessage())
	}
	if r := exec(time.Second, "sleep", "10"); r.GetExited() || !r.GetConnected() || r.GetMessage() == "" {
		t.Errorf("sleep 10 with a 1s timeout: connected %v, exited %v, message %q; want connected, not exited, a message",
			r.GetConnected(), r.GetExited(), r.GetMessage())
	}
	if g, ok := driver.Optional[driver.GuestAgent](ctx, vm.d); ok {
		if info, err := g.GuestAgentInfo(ctx, vm.id); err != nil || !info.GetConnected() {
			t.Errorf("GuestAgentInfo with the agent answering pings: %v, %s; want connected", info, describe(err))
		}
	}
}
