package qmp

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// GuestAgentMarker is what the test guest prints once qemu-ga runs on the agent's port.
const GuestAgentMarker = "KUBEVISOR-AGENT: " + AgentPort

// buildInfo returns key of the test guest's BUILD-INFO (key=value lines).
func buildInfo(t *testing.T, dir, key string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "BUILD-INFO"))
	if err != nil {
		t.Fatalf("BUILD-INFO of the test guest (make guest): %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && k == key {
			return v
		}
	}
	t.Fatalf("BUILD-INFO has no %s", key)
	return ""
}

// TestGuestAgentRealGuest boots the test guest, whose qemu-ga answers on the agent's
// virtio-serial port, and reads its OS through GuestAgentInfo across the plugin boundary.
func TestGuestAgentRealGuest(t *testing.T) {
	t.Parallel()
	dir := guestDir()
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz", "BUILD-INFO"} {
		testenv.File(t, filepath.Join(dir, f), "guest")
	}
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ga, ok := driver.Optional[driver.GuestAgent](context.Background(), h.HypervisorClient)
	if !ok {
		t.Fatal("the driver's client does not offer GuestAgent")
	}
	ctx := context.Background()
	spec := echoSpec(t, "agent", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	spec.Disks = nil
	spec.Memory.GuestBytes = 256 << 20
	cmdline := "console=ttyS0"
	if raw, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		cmdline = strings.TrimSpace(string(raw))
	}
	spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
		KernelPath: filepath.Join(dir, "vmlinuz"), InitrdPath: filepath.Join(dir, "initramfs.cpio.gz"), Cmdline: cmdline,
	}}}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := ga.GuestAgentInfo(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("GuestAgentInfo of a created VM = %v, want FailedPrecondition", err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	// Right after the start the guest is still booting: no agent answers yet, which is not an
	// error, and the call returns within its bound.
	begin := time.Now()
	early, err := ga.GuestAgentInfo(ctx, spec.GetId())
	if err != nil {
		t.Fatalf("GuestAgentInfo while booting: %v", err)
	}
	if took := time.Since(begin); took > agentTimeout+2*time.Second {
		t.Errorf("GuestAgentInfo while booting took %s, more than its bound %s", took, agentTimeout)
	}
	t.Logf("while booting: connected=%v message=%q", early.GetConnected(), early.GetMessage())

	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, GuestAgentMarker, 1, 120*time.Second)
	out.waitCount(t, GuestReadyMarker, 1, 120*time.Second)

	var info *hypervisorv1.GuestAgentInfoResponse
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err = ga.GuestAgentInfo(ctx, spec.GetId())
		if err != nil {
			t.Fatalf("GuestAgentInfo: %v", err)
		}
		if info.GetConnected() || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if !info.GetConnected() {
		t.Fatalf("the guest agent is not connected 30 s after %s: %s\nconsole:\n%s", GuestAgentMarker, info.GetMessage(), out.String())
	}
	gos := info.GetOs()
	t.Logf("guest agent %s: %+v host %q zone %q; message %q", info.GetVersion(), gos, info.GetHostName(), info.GetTimezone(), info.GetMessage())
	if gos.GetId() != "debian" || gos.GetVersionId() != "12" || !strings.HasPrefix(gos.GetPrettyName(), "Debian GNU/Linux 12") {
		t.Errorf("os = %+v, want Debian 12 (id debian, versionId 12)", gos)
	}
	if want := buildInfo(t, dir, "kernel-release"); gos.GetKernelRelease() != want {
		t.Errorf("kernelRelease = %q, want the test guest's kernel %q", gos.GetKernelRelease(), want)
	}
	if gos.GetMachine() != "x86_64" || gos.GetKernelVersion() == "" {
		t.Errorf("machine %q, kernelVersion %q; want x86_64 and a version", gos.GetMachine(), gos.GetKernelVersion())
	}
	if !strings.HasPrefix(info.GetVersion(), "7.2") {
		t.Errorf("agent version = %q, want Debian 12's qemu-guest-agent 7.2", info.GetVersion())
	}
	if info.GetHostName() != "kubevisor-guest" {
		t.Errorf("host name = %q, want kubevisor-guest", info.GetHostName())
	}
	if info.GetMessage() != "" {
		t.Errorf("message = %q, want every query answered", info.GetMessage())
	}
	// Again: a second connection resynchronises with the same agent.
	if again, err := ga.GuestAgentInfo(ctx, spec.GetId()); err != nil || !again.GetConnected() {
		t.Errorf("second GuestAgentInfo = %v, %v", again, err)
	}
	ge, ok := driver.Optional[driver.GuestExecer](ctx, h.HypervisorClient)
	if !ok {
		t.Fatal("the driver's client does not offer GuestExecer")
	}
	checkGuestExec(t, ge, spec.GetId())
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := ga.GuestAgentInfo(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GuestAgentInfo of a stopped VM = %v, want FailedPrecondition", err)
	}
	if _, err := ge.GuestAgentPing(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GuestAgentPing of a stopped VM = %v, want FailedPrecondition", err)
	}
	if _, err := ge.GuestAgentExec(ctx, spec.GetId(), []string{"true"}, time.Second); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GuestAgentExec of a stopped VM = %v, want FailedPrecondition", err)
	}
}

// checkGuestExec pings the running test guest's agent and runs commands in it through
// GuestAgentExec: what the guest's kernel says (/proc/uptime), a command's exit status and its
// two outputs, a program the guest does not have, and a command that outlives its timeout,
// after which the agent still answers.
func checkGuestExec(t *testing.T, ge driver.GuestExecer, id string) {
	t.Helper()
	ctx := context.Background()
	if p, err := ge.GuestAgentPing(ctx, id); err != nil || !p.GetConnected() {
		t.Errorf("GuestAgentPing = %v, %v; want connected", p, err)
	}
	exec := func(timeout time.Duration, command ...string) *hypervisorv1.GuestAgentExecResponse {
		t.Helper()
		begin := time.Now()
		r, err := ge.GuestAgentExec(ctx, id, command, timeout)
		if err != nil {
			t.Fatalf("GuestAgentExec %q: %v", command, err)
		}
		t.Logf("GuestAgentExec %q in %s: exited=%v code=%d signal=%d stdout=%q stderr=%q message=%q", command, time.Since(begin).Round(time.Millisecond),
			r.GetExited(), r.GetExitCode(), r.GetSignal(), r.GetStdout(), r.GetStderr(), r.GetMessage())
		if took := time.Since(begin); took > timeout+2*time.Second {
			t.Errorf("GuestAgentExec %q took %s, more than its timeout %s", command, took, timeout)
		}
		return r
	}
	up := exec(10*time.Second, "cat", "/proc/uptime")
	var secs, idle float64
	if _, err := fmt.Sscanf(string(up.GetStdout()), "%f %f", &secs, &idle); err != nil || !up.GetExited() || up.GetExitCode() != 0 || secs <= 0 {
		t.Errorf("cat /proc/uptime: %+v (%v); want exit 0 and the guest's uptime", up, err)
	}
	r := exec(10*time.Second, "sh", "-c", "echo out; echo err >&2; exit 3")
	if !r.GetExited() || r.GetExitCode() != 3 || string(r.GetStdout()) != "out\n" || string(r.GetStderr()) != "err\n" || r.GetMessage() != "" {
		t.Errorf("sh -c 'echo out; echo err >&2; exit 3': %+v; want exit 3, out and err", r)
	}
	if r := exec(10*time.Second, "/no/such/program"); r.GetExited() || !r.GetConnected() || r.GetMessage() == "" {
		t.Errorf("a program the guest does not have: %+v; want connected, not exited, the agent's error", r)
	}
	if r := exec(500*time.Millisecond, "sleep", "3"); r.GetExited() || !r.GetConnected() || !strings.Contains(r.GetMessage(), "still running") {
		t.Errorf("sleep 3 with a 500ms timeout: %+v; want not exited, still running", r)
	}
	if r := exec(10*time.Second, "echo", "again"); !r.GetExited() || r.GetExitCode() != 0 || string(r.GetStdout()) != "again\n" {
		t.Errorf("echo again after a timed out command: %+v", r)
	}
	if _, err := ge.GuestAgentExec(ctx, id, nil, time.Second); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GuestAgentExec of no command = %v, want InvalidArgument", err)
	}
}

// TestGuestAgentNoAgent: a guest without an agent (the echo boot sector) is connected false,
// within the call's bound.
func TestGuestAgentNoAgent(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ga, _ := driver.Optional[driver.GuestAgent](context.Background(), h.HypervisorClient)
	ctx := context.Background()
	spec := echoSpec(t, "noagent", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	begin := time.Now()
	info, err := ga.GuestAgentInfo(ctx, spec.GetId())
	if err != nil || info.GetConnected() || !strings.Contains(info.GetMessage(), "does not answer") {
		t.Fatalf("GuestAgentInfo = %v, %v; want connected false, the agent does not answer", info, err)
	}
	if took := time.Since(begin); took > agentTimeout+2*time.Second {
		t.Errorf("GuestAgentInfo took %s, more than its bound %s", took, agentTimeout)
	}
	ge, _ := driver.Optional[driver.GuestExecer](ctx, h.HypervisorClient)
	begin = time.Now()
	if p, err := ge.GuestAgentPing(ctx, spec.GetId()); err != nil || p.GetConnected() || !strings.Contains(p.GetMessage(), "does not answer") {
		t.Errorf("GuestAgentPing = %v, %v; want connected false, the agent does not answer", p, err)
	}
	if r, err := ge.GuestAgentExec(ctx, spec.GetId(), []string{"true"}, time.Second); err != nil || r.GetConnected() || r.GetExited() || r.GetMessage() == "" {
		t.Errorf("GuestAgentExec = %v, %v; want connected false with a message", r, err)
	}
	if took := time.Since(begin); took > agentTimeout+time.Second+2*time.Second {
		t.Errorf("GuestAgentPing and GuestAgentExec took %s, more than their bounds", took)
	}
}
