package qmp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestThroughLauncher: QEMU started through a kubevisor-launcher in its own pid and network
// namespaces; SIGTERM to the launcher makes the driver shut the VM down gracefully.
func TestThroughLauncher(t *testing.T) {
	t.Parallel()
	requireQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir, sock, lc, exited := launcherInNamespaces(ctx, t)
	lpid := lc.LauncherPid()

	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	spec := echoSpec(t, "seam", true, 0)
	spec.Sandbox = &domainv1.Sandbox{LauncherSocket: sock, NetnsPath: "/proc/" + strconv.Itoa(lpid) + "/ns/net"}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	qpid := int(st.GetPid())
	raw, _ := os.ReadFile("/proc/" + strconv.Itoa(qpid) + "/stat")
	t.Logf("qemu pid %d (here), launcher pid %d (here); stat: %.80s", qpid, lpid, raw)
	if pp, _ := parentOf(qpid); pp != lpid {
		t.Errorf("qemu's parent %d, want the launcher %d", pp, lpid)
	}
	qns, _ := os.Readlink("/proc/" + strconv.Itoa(qpid) + "/ns/net")
	lns, _ := os.Readlink("/proc/" + strconv.Itoa(lpid) + "/ns/net")
	if qns != lns {
		t.Errorf("qemu in %s, launcher in %s", qns, lns)
	}
	info, _ := lc.Info(ctx)
	t.Logf("launcher info: %v", info)

	events, err := lc.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		for {
			ev, err := events.Recv()
			if err != nil {
				shut <- err
				return
			}
			if ev.GetType() == launcherv1.EventType_EVENT_TYPE_TERMINATING {
				_, err := h.Shutdown(ctx, spec.GetId(), time.Until(ev.GetDeadline().AsTime()))
				shut <- err
				return
			}
		}
	}()
	if err := unix.Kill(lpid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown on TERMINATING: %v", err)
	}
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("launcher exit code %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("launcher did not exit")
	}
	ls, err := launcher.ReadStatus(dir)
	if err != nil || ls.Reason != launcher.ReasonVMExited {
		t.Errorf("launcher status %+v, %v", ls, err)
	}
	t.Logf("launcher status: %+v %+v", ls, ls.Process.Exit)
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED); st.GetReason() != driver.ReasonGuestShutdown {
		t.Errorf("reason %q", st.GetReason())
	}
}

// launcherInNamespaces starts a kubevisor-launcher in network and pid namespaces of its own, as
// in a launcher pod, and connects to it. It returns the launcher's directory, its socket, the
// client (closed when the test ends) and a channel that gets the launcher's exit code; the
// launcher is killed when the test ends.
func launcherInNamespaces(ctx context.Context, t *testing.T) (dir, sock string, lc *lclient.Client, exited <-chan int) {
	t.Helper()
	testenv.Root(t, "runs the launcher in network and PID namespaces")
	binDir := t.TempDir()
	if err := testbin.Build(binDir, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "kubevisor-launcher")
	dir = filepath.Join(t.TempDir(), "vmi")
	cmd := exec.Command("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--", bin, "--dir", dir, "--grace-period", "20s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	code := make(chan int, 1)
	go func() { _ = cmd.Wait(); code <- cmd.ProcessState.ExitCode() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sock = filepath.Join(dir, lclient.SocketName)
	lc, err := lclient.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	return dir, sock, lc, code
}

func parentOf(pid int) (int, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := len(raw) - 1
	for raw[i] != ')' {
		i--
	}
	var state string
	var ppid int
	_, err = fmt.Sscan(string(raw[i+2:]), &state, &ppid)
	return ppid, err
}
