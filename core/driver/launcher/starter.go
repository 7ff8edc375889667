package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Command is a VM process to start.
type Command struct {
	// Path is the binary and Args its arguments (without the binary).
	Path string
	Args []string
	// Env, when set, is the process's whole environment; empty means the starter's own (the
	// launcher's, or the caller's for LocalStarter).
	Env []string
	// LogPath receives the process's stdout and stderr, appended.
	LogPath string
	// NetNS, when set, is the network namespace the process must run in
	// (DomainSpec.sandbox.netns_path: /proc/PID/ns/net or /run/netns/NAME).
	NetNS string
	// ExtraFiles are passed to the process as fds 3, 4, ...; they stay open in the caller.
	ExtraFiles []*os.File
	// Companions are helper processes started, in order, before the process (a TPM emulator
	// it connects to through a descriptor each holds one end of).
	Companions []*Companion
}

// Companion is a helper process of a VM process: Path, Args, LogPath and ExtraFiles are as in
// Command; Name says what it is ("swtpm").
type Companion struct {
	Name       string
	Path       string
	Args       []string
	LogPath    string
	ExtraFiles []*os.File
}

// Starter starts VM processes. An implementation MUST:
//
//   - return the pid, in the caller's pid namespace, of the process running Command.Path itself
//     (not of a wrapper that forks), which the caller may poll and signal with a pidfd;
//   - start it in a session of its own with stdin /dev/null and its output in Command.LogPath,
//     so that it outlives the caller's process and process group;
//   - start it in Command.NetNS when that is set, or fail;
//   - start Command.Companions before it, in order, the same way (own session, stdin
//     /dev/null, output in their LogPath, in NetNS), kill those started when it cannot be
//     started, and stop them once it exits (SocketStarter: the launcher does, always;
//     LocalStarter: only while the caller lives, so a companion should also end itself when
//     its VM process is gone, as swtpm --terminate does).
type Starter interface {
	Start(ctx context.Context, c *Command) (pid int, err error)
}

var (
	_ Starter = (*SocketStarter)(nil)
	_ Starter = LocalStarter{}
)

// For returns the Starter for a VM of the sandbox: a SocketStarter on its launcher_socket, or
// LocalStarter when it names none.
func For(sandbox *domainv1.Sandbox) Starter {
	if s := sandbox.GetLauncherSocket(); s != "" {
		return NewStarter(s)
	}
	return LocalStarter{}
}

// DefaultDialTimeout bounds how long SocketStarter waits for its launcher when ctx has no
// deadline.
const DefaultDialTimeout = 30 * time.Second

// SocketStarter starts VM processes through the launcher serving Socket. Its Start:
//
//   - runs Path itself (no wrapper), as the launcher's child: in a session of its own, in the
//     launcher's cgroup and namespaces, reaped by the launcher;
//   - returns the pid in the caller's pid namespace, which the caller may pidfd_open and signal;
//   - fails if NetNS names another network namespace than the launcher's (the process can only
//     run in the launcher's);
//   - passes ExtraFiles by SCM_RIGHTS; they stay open in the caller;
//   - with KillLeftover, first kills the process the launcher still runs, if any.
//
// Path must name the binary as the launcher sees it (in a cluster: in the launcher's image).
type SocketStarter struct {
	Socket string
	// DialTimeout bounds waiting for the launcher when ctx has no deadline (0:
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// KillLeftover has Start kill the process the launcher runs (Client.KillRunning) before it
	// starts the new one, where the launcher would refuse a second. For a driver that knows the
	// VM runs no process, what the launcher runs is a leftover of a start an earlier process of
	// the driver did not finish: SIGKILLed after the launcher started the VM process but before
	// the driver recorded it, no later driver process knows that process, and the VM could
	// never be started again in its sandbox.
	KillLeftover bool
	// Leftover, when set, is told of each process KillLeftover killed.
	Leftover func(*launcherv1.Process)
}

// NewStarter returns a SocketStarter for the launcher serving socket
// (DomainSpec.sandbox.launcher_socket).
func NewStarter(socket string) *SocketStarter { return &SocketStarter{Socket: socket} }

// Start implements Starter.
func (s *SocketStarter) Start(ctx context.Context, c *Command) (int, error) {
	if _, ok := ctx.Deadline(); !ok {
		timeout := s.DialTimeout
		if timeout <= 0 {
			timeout = DefaultDialTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cl, err := Dial(ctx, s.Socket)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	if c.NetNS != "" {
		info, err := cl.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("launcher info: %w", err)
		}
		ns, err := procfs.NSInode(c.NetNS)
		if err != nil {
			return 0, fmt.Errorf("network namespace: %w", err)
		}
		if ns != info.GetNetNamespace() {
			return 0, fmt.Errorf("network namespace %s (net:[%d]) is not the launcher's (net:[%d]): the process can only run in the launcher's", c.NetNS, ns, info.GetNetNamespace())
		}
	}
	if s.KillLeftover {
		p, err := cl.KillRunning(ctx)
		if err != nil {
			return 0, fmt.Errorf("the launcher's leftover process: %w", err)
		}
		if p != nil && s.Leftover != nil {
			s.Leftover(p)
		}
	}
	opts := &StartOptions{
		Argv: append([]string{c.Path}, c.Args...), Env: c.Env, LogPath: c.LogPath,
		Name: filepath.Base(c.Path), ExtraFiles: c.ExtraFiles,
	}
	for _, co := range c.Companions {
		opts.Companions = append(opts.Companions, &CompanionOptions{
			Argv: append([]string{co.Path}, co.Args...), LogPath: co.LogPath, Name: co.Name, ExtraFiles: co.ExtraFiles,
		})
	}
	st, err := cl.Start(ctx, opts)
	if err != nil {
		return 0, err
	}
	if st.LocalPid == 0 {
		p := st.Process
		return 0, fmt.Errorf("%s started as pid %d in the launcher, but it is not visible in this pid namespace (exited at once, or the launcher's pid namespace is not below this one)", p.GetName(), p.GetPid())
	}
	return st.LocalPid, nil
}

// LocalStarter starts VM processes as children of the caller, for a VM without a launcher: each
// in a session of its own (so that it outlives the caller's process group and the caller
// itself), with stdin /dev/null and its output appended to LogPath, and in NetNS through
// nsenter, which execs the binary so that the pid is the VM's. The caller reaps it. Companions
// are started the same way before it; they get SIGTERM, then SIGKILL after LocalCompanionGrace,
// when the process exits while the caller lives, and SIGKILL at once when it cannot be started.
type LocalStarter struct{}

// LocalCompanionGrace is how long LocalStarter's companions have to exit after SIGTERM.
const LocalCompanionGrace = 2 * time.Second

// Start implements Starter.
func (LocalStarter) Start(_ context.Context, c *Command) (int, error) {
	var comps []*exec.Cmd
	for _, co := range c.Companions {
		cmd, err := startLocal(co.Path, co.Args, nil, co.LogPath, c.NetNS, co.ExtraFiles)
		if err != nil {
			killLocal(comps)
			return 0, fmt.Errorf("start companion %s: %w", co.Name, err)
		}
		comps = append(comps, cmd)
	}
	cmd, err := startLocal(c.Path, c.Args, c.Env, c.LogPath, c.NetNS, c.ExtraFiles)
	if err != nil {
		killLocal(comps)
		return 0, err
	}
	exited := make(chan struct{})
	for _, comp := range comps {
		go func() {
			_ = comp.Wait()
		}()
		go func() {
			<-exited
			_ = comp.Process.Signal(syscall.SIGTERM)
			time.AfterFunc(LocalCompanionGrace, func() { _ = comp.Process.Kill() })
		}()
	}
	go func() { // reap; the caller watches the pid with a pidfd
		_ = cmd.Wait()
		close(exited)
	}()
	return cmd.Process.Pid, nil
}

// startLocal starts one process of LocalStarter; the caller reaps it.
func startLocal(path string, args, env []string, logPath, netns string, files []*os.File) (*exec.Cmd, error) {
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer log.Close()
	if netns != "" {
		args = append([]string{"--net=" + netns, "--", path}, args...)
		path = "nsenter"
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = env
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// killLocal kills and reaps companions started before a failed start.
func killLocal(cmds []*exec.Cmd) {
	for _, cmd := range cmds {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}
