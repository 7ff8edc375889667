package qmp

import (
	"bufio"
	"context"
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
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := ga.GuestAgentInfo(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GuestAgentInfo of a stopped VM = %v, want FailedPrecondition", err)
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
}
