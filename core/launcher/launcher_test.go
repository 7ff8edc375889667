package launcher_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

func TestDirectoryChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"group readable", func(t *testing.T, dir string) { mkdir(t, dir, 0o750) }, "accessible by group or others (mode 0750)"},
		{"world writable", func(t *testing.T, dir string) { mkdir(t, dir, 0o703) }, "accessible by group or others (mode 0703)"},
		{"owned by another user", func(t *testing.T, dir string) {
			mkdir(t, dir, 0o700)
			testenv.Root(t, "chowns a directory to another user")
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatalf("chown: %v", err)
			}
		}, "is owned by uid 65534"},
		{"symlink", func(t *testing.T, dir string) {
			real := dir + "-real"
			mkdir(t, real, 0o700)
			if err := os.Symlink(real, dir); err != nil {
				t.Fatal(err)
			}
		}, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "vmi")
			tc.setup(t, dir)
			in := run(t, options{dir: dir})
			if code := in.wait(10 * time.Second); code != launcher.ExitStartFailed {
				t.Errorf("exit code %d, want %d", code, launcher.ExitStartFailed)
			}
			if !strings.Contains(in.logs(), tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, in.logs())
			}
			for _, name := range []string{launcher.SocketName, launcher.StatusFileName} {
				if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
					t.Errorf("%s was created in a directory that failed the checks", name)
				}
			}
		})
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func TestCreatesDirectoryAndSockets(t *testing.T) {
	t.Parallel()
	in, _ := start(t, options{})
	fi, err := os.Stat(in.dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("directory mode %04o, want 0700", perm)
	}
	for _, name := range []string{launcher.SocketName, launcher.FilesSocketName} {
		fi, err := os.Stat(filepath.Join(in.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s mode %04o, want 0600", name, perm)
		}
	}
}

func TestSecondLauncherOnDirectoryRefused(t *testing.T) {
	t.Parallel()
	first, c := start(t, options{})
	second := run(t, options{dir: first.dir})
	if code := second.wait(10 * time.Second); code != launcher.ExitStartFailed {
		t.Errorf("second launcher: exit code %d, want %d", code, launcher.ExitStartFailed)
	}
	if !strings.Contains(second.logs(), "another launcher serves") {
		t.Errorf("second launcher's stderr:\n%s", second.logs())
	}
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Errorf("first launcher after the second: %v", err)
	}
}

func TestStartSignalWait(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	logPath := filepath.Join(in.dir, "vm.log")
	st, err := c.Start(ctx, &lclient.StartOptions{
		Argv: []string{"sh", "-c", "echo out; echo err >&2; exec sleep 60"}, LogPath: logPath, Name: "vm",
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := int(st.Process.GetPid())
	if st.LocalPid != pid || st.Process.GetHostPid() != int64(pid) {
		t.Errorf("pids: launcher's %d, host %d, local %d; want all equal in one pid namespace", pid, st.Process.GetHostPid(), st.LocalPid)
	}
	stat := procStat(t, pid)
	if ppid := stat[4-3]; ppid != strconv.Itoa(in.cmd.Process.Pid) {
		t.Errorf("parent %s, want the launcher %d", ppid, in.cmd.Process.Pid)
	}
	if pgrp, sid := stat[5-3], stat[6-3]; pgrp != strconv.Itoa(pid) || sid != strconv.Itoa(pid) {
		t.Errorf("process group %s, session %s: want its own (%d)", pgrp, sid, pid)
	}
	if stdin, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/0"); stdin != os.DevNull {
		t.Errorf("stdin is %q, want %s", stdin, os.DevNull)
	}
	waitFor(t, 5*time.Second, "the log", func() bool {
		raw, _ := os.ReadFile(logPath)
		return string(raw) == "out\nerr\n"
	})
	if fi, err := os.Stat(logPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("log: %v %v", fi.Mode(), err)
	}

	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.GetProcess().GetRunning() || info.GetProcess().GetProcess().GetPid() != int64(pid) || info.GetProcess().GetProcess().GetName() != "vm" {
		t.Errorf("info.process = %v", info.GetProcess())
	}
	if info.GetPid() != int64(in.cmd.Process.Pid) || info.GetCgroup() == "" || info.GetNetNamespace() == 0 {
		t.Errorf("info = %v", info)
	}

	if err := c.Signal(ctx, pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if exit.GetSignal() != int32(unix.SIGTERM) || exit.GetCode() != -1 || exit.GetDescription() != "signal: terminated" {
		t.Errorf("exit = %v, want killed by SIGTERM", exit)
	}
	if err := c.Signal(ctx, pid, unix.SIGTERM); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("signal an exited process: %v, want FailedPrecondition", err)
	}
	if err := c.Signal(ctx, 1, unix.SIGTERM); status.Code(err) != codes.NotFound {
		t.Errorf("signal pid 1: %v, want NotFound", err)
	}
}

func TestExitStatusRestartAndExit(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(in.dir, "vm.log")
	st, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sh", "-c", "exit 7"}, LogPath: logPath})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, int(st.Process.GetPid()))
	if err != nil {
		t.Fatal(err)
	}
	if exit.GetCode() != 7 || exit.GetSignal() != 0 || exit.GetDescription() != "exit status 7" {
		t.Errorf("exit = %v, want exit status 7", exit)
	}
	for _, want := range []launcherv1.EventType{launcherv1.EventType_EVENT_TYPE_STARTED, launcherv1.EventType_EVENT_TYPE_EXITED} {
		ev, err := events.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetType() != want || ev.GetProcess().GetPid() != st.Process.GetPid() {
			t.Errorf("event %v, want %v of pid %d", ev, want, st.Process.GetPid())
		}
		if want == launcherv1.EventType_EVENT_TYPE_EXITED && ev.GetExit().GetCode() != 7 {
			t.Errorf("exited event: %v", ev.GetExit())
		}
	}

	// The launcher outlives its process and starts another.
	st2, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: logPath})
	if err != nil {
		t.Fatalf("start after an exit: %v", err)
	}
	_, err = c.Start(ctx, &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: logPath})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "one process at a time") {
		t.Errorf("second start: %v, want FailedPrecondition", err)
	}
	if err := c.Exit(ctx); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("exit while the process runs: %v, want FailedPrecondition", err)
	}
	if err := c.Signal(ctx, int(st2.Process.GetPid()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(st2.Process.GetPid())); err != nil {
		t.Fatal(err)
	}
	if err := c.Exit(ctx); err != nil {
		t.Fatal(err)
	}
	if code := in.wait(10 * time.Second); code != launcher.ExitOK {
		t.Errorf("exit code %d", code)
	}
	s := in.status()
	if s.Reason != launcher.ReasonLauncherTerminated || s.ExitCode != 0 || s.VMI != t.Name() ||
		s.Process == nil || s.Process.Pid != st2.Process.GetPid() || s.Process.Exit == nil || s.Process.Exit.Description != "signal: killed" {
		t.Errorf("status = %+v (process %+v)", s, s.Process)
	}
	// The subscriber sees the second process come and go, then the end of the stream.
	var got []launcherv1.EventType
	for {
		ev, err := events.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		got = append(got, ev.GetType())
	}
	if len(got) != 2 || got[0] != launcherv1.EventType_EVENT_TYPE_STARTED || got[1] != launcherv1.EventType_EVENT_TYPE_EXITED {
		t.Errorf("events after the restart: %v", got)
	}
	if _, err := os.Stat(filepath.Join(in.dir, launcher.SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	logPath := filepath.Join(in.dir, "vm.log")
	for _, tc := range []struct {
		name string
		req  *launcherv1.StartRequest
		code codes.Code
	}{
		{"no argv", &launcherv1.StartRequest{LogPath: logPath}, codes.InvalidArgument},
		{"relative log", &launcherv1.StartRequest{Argv: []string{"true"}, LogPath: "vm.log"}, codes.InvalidArgument},
		{"bad env", &launcherv1.StartRequest{Argv: []string{"true"}, LogPath: logPath, Env: []string{"NOVALUE"}}, codes.InvalidArgument},
		{"unknown files token", &launcherv1.StartRequest{Argv: []string{"true"}, LogPath: logPath, FilesToken: "0123"}, codes.InvalidArgument},
		{"no such program", &launcherv1.StartRequest{Argv: []string{"/nonexistent/qemu"}, LogPath: logPath}, codes.FailedPrecondition},
	} {
		if _, err := c.API().Start(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	// Terminated after a failed start: start-failed says why.
	if err := in.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := in.wait(10 * time.Second); code != launcher.ExitStartFailed {
		t.Errorf("exit code %d, want %d", code, launcher.ExitStartFailed)
	}
	if s := in.status(); s.Reason != launcher.ReasonStartFailed || !strings.Contains(s.Message, "/nonexistent/qemu") {
		t.Errorf("status = %+v", s)
	}
}

func TestExtraFilesBySCMRights(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	var reads []*os.File
	var writes []*os.File
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		reads, writes = append(reads, r), append(writes, w)
	}
	st, err := c.Start(ctx, &lclient.StartOptions{
		Argv:    []string{"sh", "-c", "echo three >&3; echo four >&4"},
		LogPath: filepath.Join(in.dir, "vm.log"), ExtraFiles: writes,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(st.Process.GetPid())); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"three\n", "four\n"} {
		writes[i].Close() // ours; the launcher closed its copies, the process exited
		got, err := io.ReadAll(reads[i])
		if err != nil || string(got) != want {
			t.Errorf("fd %d: %q, %v; want %q", 3+i, got, err, want)
		}
	}
}

func TestProcessGroupDoesNotOutliveProcess(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	logPath := filepath.Join(in.dir, "vm.log")
	st, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sh", "-c", "sleep 60 & echo $!; exit 3"}, LogPath: logPath})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(st.Process.GetPid())); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(logPath)
	helper, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("log %q: %v", raw, err)
	}
	waitFor(t, 5*time.Second, "the helper left in the process group to be killed and reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(helper))
		return errors.Is(err, os.ErrNotExist)
	})
}

func TestTerminateCooperativeVM(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{flags: []string{"--grace-period", "20s"}})
	ctx := ctxT(t)
	st, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: filepath.Join(in.dir, "vm.log"), Name: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	pid := int(st.Process.GetPid())
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := in.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The subscriber (the hypervisor driver's part) sees TERMINATING and stops the VM.
	ev, err := events.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetType() != launcherv1.EventType_EVENT_TYPE_TERMINATING {
		t.Fatalf("event %v, want TERMINATING", ev)
	}
	if d := ev.GetDeadline().AsTime().Sub(sent); d < 15500*time.Millisecond || d > 16500*time.Millisecond {
		t.Errorf("deadline %s after SIGTERM, want 16s (grace 20s - margin 4s)", d)
	}
	if ev.GetGracePeriod().AsDuration() != 20*time.Second {
		t.Errorf("grace period %s", ev.GetGracePeriod().AsDuration())
	}
	if _, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"true"}, LogPath: filepath.Join(in.dir, "vm.log")}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("start while terminating: %v, want FailedPrecondition", err)
	}
	// A late subscriber learns it too.
	late, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := late.Recv(); err != nil || ev.GetType() != launcherv1.EventType_EVENT_TYPE_TERMINATING {
		t.Errorf("late subscriber: %v, %v", ev, err)
	}
	if err := c.Signal(ctx, pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := in.wait(10 * time.Second); code != launcher.ExitOK {
		t.Errorf("exit code %d, want 0", code)
	}
	if ev, err := events.Recv(); err != nil || ev.GetType() != launcherv1.EventType_EVENT_TYPE_EXITED {
		t.Errorf("after TERMINATING: %v, %v; want EXITED", ev, err)
	}
	if _, err := events.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("end of events: %v, want EOF", err)
	}
	s := in.status()
	if s.Reason != launcher.ReasonVMExited || s.ExitCode != 0 || s.Process == nil || s.Process.Name != "vm" ||
		s.Process.Exit == nil || s.Process.Exit.Signal != int32(unix.SIGTERM) {
		t.Errorf("status = %+v (process %+v)", s, s.Process)
	}
}

func TestTerminateUncooperativeVMKilledAtDeadline(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{flags: []string{"--grace-period", "1500ms"}})
	ctx := ctxT(t)
	// A VM that ignores SIGTERM (ignored signals stay ignored across exec).
	st, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sh", "-c", `trap "" TERM; exec sleep 60`}, LogPath: filepath.Join(in.dir, "vm.log")})
	if err != nil {
		t.Fatal(err)
	}
	pidfd := pidfdOpen(t, st.LocalPid)
	sent := time.Now()
	if err := in.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := in.wait(10 * time.Second)
	took := time.Since(sent)
	if code != launcher.ExitKilledAtDeadline {
		t.Errorf("exit code %d, want %d", code, launcher.ExitKilledAtDeadline)
	}
	// Forced at 1.5s - 0.3s (SIGTERM), then SIGKILL 0.15s later: before the grace period ends.
	if took < 1200*time.Millisecond || took > 1500*time.Millisecond+500*time.Millisecond {
		t.Errorf("launcher exited %s after SIGTERM, want about 1.35s", took)
	}
	if !waitGone(t, pidfd, 0) {
		t.Error("the VM process outlived the launcher")
	}
	s := in.status()
	if s.Reason != launcher.ReasonKilledAtDeadline || s.ExitCode != launcher.ExitKilledAtDeadline ||
		s.Process == nil || s.Process.Exit == nil || s.Process.Exit.Signal != int32(unix.SIGKILL) {
		t.Errorf("status = %+v (process %+v)", s, s.Process)
	}
}

func TestLauncherKilledTakesVMWithIt(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	st, err := c.Start(ctxT(t), &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: filepath.Join(in.dir, "vm.log")})
	if err != nil {
		t.Fatal(err)
	}
	pidfd := pidfdOpen(t, st.LocalPid)
	if err := in.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	in.wait(5 * time.Second)
	if !waitGone(t, pidfd, 5*time.Second) {
		t.Fatalf("VM process %d still runs after its launcher was killed", st.LocalPid)
	}
	if _, err := launcher.ReadStatus(in.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a killed launcher wrote a status: %v", err)
	}
}

func TestProcessRunsInLauncherNetworkNamespace(t *testing.T) {
	t.Parallel()
	testenv.Root(t, "runs the launcher in a network namespace of its own")
	in, c := start(t, options{wrap: []string{"unshare", "--net", "--"}})
	ctx := ctxT(t)
	launcherPid := in.cmd.Process.Pid // unshare without --fork execs the launcher
	if c.LauncherPid() != launcherPid {
		t.Errorf("client's launcher pid %d, want %d", c.LauncherPid(), launcherPid)
	}
	lns := nsLink(t, launcherPid, "net")
	if lns == nsLink(t, "self", "net") {
		t.Fatal("the launcher runs in the test's network namespace")
	}
	st, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: filepath.Join(in.dir, "vm.log")})
	if err != nil {
		t.Fatal(err)
	}
	if got := nsLink(t, st.LocalPid, "net"); got != lns {
		t.Errorf("process in %s, launcher in %s", got, lns)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "net:[" + strconv.FormatUint(info.GetNetNamespace(), 10) + "]"; want != lns {
		t.Errorf("info net namespace %s, want %s", want, lns)
	}
	if err := c.Signal(ctx, int(st.Process.GetPid()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(st.Process.GetPid())); err != nil {
		t.Fatal(err)
	}

	// The qmp adapter checks the sandbox's netns against the launcher's.
	starter := lclient.NewStarter(filepath.Join(in.dir, launcher.SocketName))
	cmd := &lclient.Command{Path: "/bin/sleep", Args: []string{"60"}, LogPath: filepath.Join(in.dir, "qemu.log"), NetNS: "/proc/self/ns/net"}
	if _, err := starter.Start(ctx, cmd); err == nil || !strings.Contains(err.Error(), "is not the launcher's") {
		t.Errorf("start in another netns: %v", err)
	}
	cmd.NetNS = "/proc/" + strconv.Itoa(launcherPid) + "/ns/net"
	pid, err := starter.Start(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if got := nsLink(t, pid, "net"); got != lns {
		t.Errorf("adapter's process in %s, launcher in %s", got, lns)
	}
	pidfd := pidfdOpen(t, pid)
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	if !waitGone(t, pidfd, 5*time.Second) {
		t.Error("adapter's process did not die")
	}
}

func TestPidsAcrossPidNamespaces(t *testing.T) {
	t.Parallel()
	testenv.Root(t, "runs the launcher in a PID namespace of its own")
	in, c := start(t, options{wrap: []string{"unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"}, flags: []string{"--grace-period", "0s"}})
	ctx := ctxT(t)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetPid() != 1 || info.GetHostPid() != 0 {
		t.Errorf("launcher pid %d host pid %d; want 1 and unknown in its own pid namespace", info.GetPid(), info.GetHostPid())
	}
	launcherPid := c.LauncherPid()
	if launcherPid <= 1 {
		t.Fatalf("launcher's pid here: %d", launcherPid)
	}
	// The adapter returns the pid of this namespace, the one a driver pidfd_opens.
	starter := lclient.NewStarter(filepath.Join(in.dir, launcher.SocketName))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pid, err := starter.Start(ctx, &lclient.Command{
		Path: "/bin/sh", Args: []string{"-c", `echo $$ >&3; exec sleep 60 3>&-`},
		LogPath: filepath.Join(in.dir, "qemu.log"), ExtraFiles: []*os.File{w},
	})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	inner, _ := io.ReadAll(r)
	innerPid, _ := strconv.Atoi(strings.TrimSpace(string(inner)))
	if pid == innerPid || innerPid == 0 {
		t.Fatalf("local pid %d, pid inside %d: want different", pid, innerPid)
	}
	if ppid := procStat(t, pid)[4-3]; ppid != strconv.Itoa(launcherPid) {
		t.Errorf("local pid %d has parent %s, want the launcher %d", pid, ppid, launcherPid)
	}
	info, err = c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetProcess().GetProcess().GetPid(); got != int64(innerPid) {
		t.Errorf("launcher reports pid %d, the process sees %d", got, innerPid)
	}
	// Terminate by the launcher's pid here: at grace 0 the VM is killed at once.
	pidfd := pidfdOpen(t, pid)
	if err := unix.Kill(launcherPid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	in.wait(10 * time.Second)
	if !waitGone(t, pidfd, 5*time.Second) {
		t.Error("the VM outlived its launcher")
	}
	if s := in.status(); s.Reason != launcher.ReasonKilledAtDeadline {
		t.Errorf("status = %+v", s)
	}
}

// gone reports whether pid no longer exists (reaped).
func gone(pid int64) func() bool {
	return func() bool {
		_, err := os.Stat("/proc/" + strconv.FormatInt(pid, 10))
		return errors.Is(err, os.ErrNotExist)
	}
}

func TestCompanionsLiveAsLongAsTheProcess(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.GetFeatures(), launcherv1.Feature_FEATURE_COMPANIONS) {
		t.Fatalf("Info features %v lack FEATURE_COMPANIONS", info.GetFeatures())
	}
	// The companion gets its own descriptor (fd 3) and its own log; one that ignores SIGTERM is
	// killed after the grace.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	compLog := filepath.Join(in.dir, "companion.log")
	st, err := c.Start(ctx, &lclient.StartOptions{
		Argv: []string{"sleep", "60"}, LogPath: filepath.Join(in.dir, "vm.log"), Name: "vm",
		Companions: []*lclient.CompanionOptions{
			{Argv: []string{"sh", "-c", "echo ready >&3; exec 3>&-; echo started; exec sleep 60"}, LogPath: compLog, Name: "helper", ExtraFiles: []*os.File{w}},
			{Argv: []string{"sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done"}, LogPath: compLog, Name: "stubborn"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if len(st.Companions) != 2 || st.Companions[0].GetName() != "helper" || st.Companions[1].GetName() != "stubborn" {
		t.Fatalf("companions %v", st.Companions)
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "ready\n" {
		t.Errorf("companion's fd 3: %q, %v", got, err)
	}
	for _, comp := range st.Companions {
		pid := int(comp.GetPid())
		stat := procStat(t, pid)
		if ppid := stat[4-3]; ppid != strconv.Itoa(in.cmd.Process.Pid) {
			t.Errorf("%s: parent %s, want the launcher %d", comp.GetName(), ppid, in.cmd.Process.Pid)
		}
		if sid := stat[6-3]; sid != strconv.Itoa(pid) {
			t.Errorf("%s: session %s, want its own", comp.GetName(), sid)
		}
		if comp.GetStartTime() == 0 || comp.GetPid() >= st.Process.GetPid() && comp.GetStartTime() > st.Process.GetStartTime() {
			t.Errorf("%s: started at %d, after the process (%d)", comp.GetName(), comp.GetStartTime(), st.Process.GetStartTime())
		}
	}
	// Both companions have started, the stubborn one with SIGTERM ignored already (a SIGTERM
	// before its trap would end it at once).
	waitFor(t, 5*time.Second, "the companions' log", func() bool {
		raw, _ := os.ReadFile(compLog)
		lines := strings.Fields(string(raw))
		slices.Sort(lines)
		return slices.Equal(lines, []string{"started", "trapped"})
	})
	// A second Start is refused at once while the process runs, and starts no companion.
	refusedAt := time.Now()
	if _, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"true"}, LogPath: filepath.Join(in.dir, "vm.log"),
		Companions: []*lclient.CompanionOptions{{Argv: []string{"sh", "-c", "echo second >>" + compLog}, LogPath: compLog}}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("second start: %v, want FailedPrecondition", err)
	} else if !strings.Contains(err.Error(), "is running") || time.Since(refusedAt) > time.Second {
		t.Errorf("second start refused after %s with %v, want at once because the process is running", time.Since(refusedAt), err)
	}

	killedAt := time.Now()
	if err := c.Signal(ctx, int(st.Process.GetPid()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the cooperative companion to exit on SIGTERM", gone(st.Companions[0].GetPid()))
	waitFor(t, 10*time.Second, "the companion ignoring SIGTERM to be killed", gone(st.Companions[1].GetPid()))
	if d := time.Since(killedAt); d < 1500*time.Millisecond {
		t.Errorf("the companion ignoring SIGTERM was gone after %s, before its grace", d)
	}
	if raw, _ := os.ReadFile(compLog); strings.Contains(string(raw), "second") {
		t.Error("a refused Start ran its companion")
	}

	// The next Start runs new companions; Exit is refused until the process is gone.
	st2, err := c.Start(ctx, &lclient.StartOptions{
		Argv: []string{"true"}, LogPath: filepath.Join(in.dir, "vm.log"),
		Companions: []*lclient.CompanionOptions{{Argv: []string{"sleep", "60"}, LogPath: compLog}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(st2.Process.GetPid())); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the second companion to exit with its process", gone(st2.Companions[0].GetPid()))
}

func TestCompanionsKilledWhenStartFails(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	logPath := filepath.Join(in.dir, "vm.log")
	pidFile := filepath.Join(in.dir, "companion.pid")
	_, err := c.Start(ctx, &lclient.StartOptions{
		Argv: []string{"/nonexistent/qemu"}, LogPath: logPath,
		Companions: []*lclient.CompanionOptions{{Argv: []string{"sh", "-c", "echo $$ >" + pidFile + "; exec sleep 60"}, LogPath: logPath}},
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "/nonexistent/qemu") {
		t.Fatalf("start: %v, want FailedPrecondition naming the program", err)
	}
	// The companion may not have written its pid yet when it was killed; if it did, it is gone.
	if raw, err := os.ReadFile(pidFile); err == nil {
		pid, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		waitFor(t, 5*time.Second, "the companion of a failed start to be killed", gone(pid))
	}
	waitFor(t, 5*time.Second, "the launcher to have no child left", func() bool {
		raw, _ := os.ReadFile("/proc/" + strconv.Itoa(in.cmd.Process.Pid) + "/task/" + strconv.Itoa(in.cmd.Process.Pid) + "/children")
		return strings.TrimSpace(string(raw)) == ""
	})
	// A companion that cannot be started fails the Start before the process.
	_, err = c.Start(ctx, &lclient.StartOptions{
		Argv: []string{"sh", "-c", "echo vm >>" + logPath}, LogPath: logPath,
		Companions: []*lclient.CompanionOptions{{Argv: []string{"/nonexistent/swtpm"}, LogPath: logPath}},
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "companion /nonexistent/swtpm") {
		t.Fatalf("start: %v, want FailedPrecondition naming the companion", err)
	}
	if _, err := c.API().Start(ctx, &launcherv1.StartRequest{Argv: []string{"true"}, LogPath: logPath,
		Companions: []*launcherv1.Companion{{Argv: []string{"true"}, LogPath: "rel.log"}}}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "companions[0].log_path") {
		t.Errorf("relative companion log: %v, want InvalidArgument naming companions[0].log_path", err)
	}
	time.Sleep(100 * time.Millisecond)
	if raw, _ := os.ReadFile(logPath); strings.Contains(string(raw), "vm") {
		t.Error("the process ran although its companion could not be started")
	}
}
