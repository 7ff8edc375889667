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
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Command is a VM process to start.
type Command struct {
	// Path is the binary and Args its arguments (without the binary).
	Path string
	Args []string
	// LogPath receives the process's stdout and stderr, appended.
	LogPath string
	// NetNS, when set, is the network namespace the process must run in
	// (DomainSpec.sandbox.netns_path: /proc/PID/ns/net or /run/netns/NAME).
	NetNS string
	// ExtraFiles are passed to the process as fds 3, 4, ...; they stay open in the caller.
	ExtraFiles []*os.File
}

// Starter starts VM processes. An implementation MUST:
//
//   - return the pid, in the caller's pid namespace, of the process running Command.Path itself
//     (not of a wrapper that forks), which the caller may poll and signal with a pidfd;
//   - start it in a session of its own with stdin /dev/null and its output in Command.LogPath,
//     so that it outlives the caller's process and process group;
//   - start it in Command.NetNS when that is set, or fail.
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
//   - passes ExtraFiles by SCM_RIGHTS; they stay open in the caller.
//
// Path must name the binary as the launcher sees it (in a cluster: in the launcher's image).
type SocketStarter struct {
	Socket string
	// DialTimeout bounds waiting for the launcher when ctx has no deadline (0:
	// DefaultDialTimeout).
	DialTimeout time.Duration
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
	st, err := cl.Start(ctx, &StartOptions{
		Argv: append([]string{c.Path}, c.Args...), LogPath: c.LogPath,
		Name: filepath.Base(c.Path), ExtraFiles: c.ExtraFiles,
	})
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
// nsenter, which execs the binary so that the pid is the VM's. The caller reaps it.
type LocalStarter struct{}

// Start implements Starter.
func (LocalStarter) Start(_ context.Context, c *Command) (int, error) {
	log, err := os.OpenFile(c.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("open log: %w", err)
	}
	defer log.Close()
	path, args := c.Path, c.Args
	if c.NetNS != "" {
		args = append([]string{"--net=" + c.NetNS, "--", path}, args...)
		path = "nsenter"
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = c.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	go func() { _ = cmd.Wait() }() // reap; the caller watches the pid with a pidfd
	return cmd.Process.Pid, nil
}
