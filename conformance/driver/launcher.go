package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// LauncherBinary is the name of the launcher the VM checks start for every VM.
const LauncherBinary = "kubevisor-launcher"

// LauncherEnv names an environment variable that may hold the path of the launcher binary.
const LauncherEnv = "KUBEVISOR_LAUNCHER"

// launcherPackage is the launcher's main package, which findLauncher builds as a last resort.
const launcherPackage = "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"

// Timeouts of the launchers of the VM checks.
const (
	launcherReady = 15 * time.Second
	launcherExit  = 10 * time.Second
)

// FindLauncher returns the launcher binary the VM checks would use without building one: path
// when it is set, else $KUBEVISOR_LAUNCHER, else kubevisor-launcher next to this executable,
// else on PATH.
func FindLauncher(path string) (string, error) { return findLauncher(path, "", false) }

// findLauncher returns the launcher binary of the VM checks: given (WithLauncher), else
// $KUBEVISOR_LAUNCHER, else kubevisor-launcher next to this executable (the CLI's bin/), else on
// PATH, else, when build is set, one built now with the go command from this module into dir.
func findLauncher(given, dir string, build bool) (string, error) {
	for _, p := range []string{given, os.Getenv(LauncherEnv)} {
		if p == "" {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if !executable(abs) {
			return "", fmt.Errorf("launcher %s is not an executable file", abs)
		}
		return abs, nil
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), LauncherBinary); executable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(LauncherBinary); err == nil {
		return filepath.Abs(p)
	}
	if !build {
		return "", fmt.Errorf("%s is found neither next to %s nor on PATH (build it: make build, or go build %s; or name it with WithLauncher, --launcher or $%s)",
			LauncherBinary, filepath.Base(os.Args[0]), launcherPackage, LauncherEnv)
	}
	if err := testbin.Build(dir, false, launcherPackage); err != nil {
		return "", fmt.Errorf("%s is found neither on PATH nor in $%s, and building it failed: %w", LauncherBinary, LauncherEnv, err)
	}
	return filepath.Join(dir, LauncherBinary), nil
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// sandboxLauncher is a kubevisor-launcher holding one VM's sandbox, as the node handler starts
// one per VMI in standalone mode.
type sandboxLauncher struct {
	dir    string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	client *launcher.Client
	// sandbox is what the VM's domain spec names: the launcher's socket and network namespace.
	sandbox *domainv1.Sandbox
}

// startLauncher starts a launcher for VM id in a directory of its own, and stops it when the
// check ends, after the cleanups registered later (the VM's removal) have run.
func (s *vmSuite) startLauncher(t T, id string) *sandboxLauncher {
	t.Helper()
	if s.launcherErr != nil {
		t.Fatalf("the VM checks run every VM under a real launcher, as the node handler does: %v", s.launcherErr)
	}
	base := shortTempDir(t)
	l := &sandboxLauncher{dir: filepath.Join(base, "launcher"), log: filepath.Join(base, "launcher.log"), exited: make(chan struct{})}
	logf, err := os.Create(l.log)
	if err != nil {
		t.Fatalf("launcher log: %v", err)
	}
	defer logf.Close()
	// Confined, setpriv execs the launcher: the same process, its pid the launcher's.
	path, args := s.confine.command(s.launcher, []string{"--dir", l.dir, "--vmi", "conformance/" + id, "--grace-period", DefaultGuestShutdownTimeout.String()})
	l.cmd = exec.Command(path, args...)
	// A file, not a pipe: waiting for a pipe would wait for the launcher's children too.
	l.cmd.Stdout, l.cmd.Stderr = logf, logf
	// A process group of its own, as the handler's: a signal to the test's group does not reach it.
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.cmd.Start(); err != nil {
		t.Fatalf("start the launcher %s: %v", s.launcher, err)
	}
	go func() {
		_ = l.cmd.Wait()
		close(l.exited)
	}()
	t.Cleanup(func() { l.stop(t) })
	ctx, cancel := context.WithTimeout(s.ctx(t), launcherReady)
	defer cancel()
	if l.client, err = launcher.Dial(ctx, filepath.Join(l.dir, launcher.SocketName)); err != nil {
		t.Fatalf("the launcher did not serve: %v; its log: %s", err, l.logTail())
	}
	pid := l.client.LauncherPid()
	if pid <= 0 {
		t.Fatalf("the launcher's pid is not visible from the kit")
	}
	switch {
	case s.confine == nil:
	case s.confine.notRoot:
		t.Logf("note: the launcher is not confined to its class's capabilities (%s): the kit runs as uid %d, not root, and so does the launcher", s.confine.describe(), os.Geteuid())
	default:
		if err := s.confine.verify(l.cmd.Process.Pid); err != nil {
			t.Fatalf("the launcher does not run as in a launcher pod of its class: %v", err)
		}
	}
	l.sandbox = &domainv1.Sandbox{
		LauncherSocket: filepath.Join(l.dir, launcher.SocketName),
		NetnsPath:      "/proc/" + strconv.Itoa(pid) + "/ns/net",
	}
	return l
}

// stop asks the launcher to exit (its VM process is gone by now), then signals it.
func (l *sandboxLauncher) stop(t T) {
	ctx, cancel := context.WithTimeout(context.Background(), launcherExit)
	defer cancel()
	if l.client != nil {
		if err := l.client.Exit(ctx); err != nil {
			t.Logf("cleanup: the launcher refused to exit: %v", err)
		}
		_ = l.client.Close()
	}
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if sig != 0 {
			_ = syscall.Kill(-l.cmd.Process.Pid, sig)
		}
		select {
		case <-l.exited:
			return
		case <-time.After(launcherExit / 2):
		}
	}
	t.Logf("cleanup: the launcher (pid %d) did not exit", l.cmd.Process.Pid)
}

// process returns the launcher's running process and its pid in the kit's pid namespace, or nil.
func (l *sandboxLauncher) process(ctx context.Context) (*launcherv1.ProcessState, int, error) {
	info, err := l.client.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	p := info.GetProcess()
	if p == nil || !p.GetRunning() {
		return p, 0, nil
	}
	return p, l.client.LocalPid(p.GetProcess()), nil
}

// logTail is the end of the launcher's log, for a message.
func (l *sandboxLauncher) logTail() string {
	raw, err := os.ReadFile(l.log)
	if err != nil {
		return "(no log)"
	}
	return tail(string(raw))
}

// checkUnderLauncher fails the check unless the VM's process, if the driver reports one, is the
// launcher's, started through sandbox.launcher_socket as the node handler needs, or a
// descendant of the launcher (forked by the process the launcher started).
func (s *vmSuite) checkUnderLauncher(t T, vm *guestVM) {
	t.Helper()
	pid := s.status(t, vm).GetPid()
	p, local, err := vm.launcher.process(s.ctx(t))
	if err != nil {
		t.Fatalf("launcher Info: %v", err)
	}
	switch {
	case pid == 0 && p == nil:
		t.Logf("note: the driver reports no VM process and started none through the launcher")
	case pid == 0:
		t.Logf("note: the driver reports no pid; the launcher runs %s (pid %d in its namespace)", p.GetProcess().GetName(), p.GetProcess().GetPid())
	case p == nil || !p.GetRunning():
		t.Fatalf("the VM process (pid %d) was not started through the launcher at sandbox.launcher_socket, which runs no process: under the node handler a VM process must be the launcher's (core/driver/launcher)", pid)
	case int64(local) != pid && vm.launcher.cmd != nil && descendantOf(int(pid), vm.launcher.cmd.Process.Pid):
		// A VM manager the launcher started (libvirt's daemon) forks the VM process, which the
		// launcher, a child subreaper, adopts when the manager daemonizes it: still the
		// sandbox's.
		t.Logf("note: the VM process (pid %d) descends from the launcher, whose own process is %s (pid %d here)", pid, p.GetProcess().GetName(), local)
	case int64(local) != pid:
		t.Fatalf("the VM process (pid %d) is not the launcher's process (%s, pid %d here): under the node handler a VM process must be started through the launcher at sandbox.launcher_socket (core/driver/launcher)", pid, p.GetProcess().GetName(), local)
	}
}
