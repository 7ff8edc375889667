package launcher

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Command is a VM process to start, in the shape hypervisor drivers hand to their launcher
// (drivers/qmp declares `type Command = launcher.Command`).
type Command struct {
	// Path is the binary and Args its arguments (without the binary).
	Path string
	Args []string
	// LogPath receives the process's stdout and stderr, appended.
	LogPath string
	// NetNS, when set, is the network namespace the process must run in (a path such as
	// /proc/PID/ns/net or /run/netns/NAME).
	NetNS string
	// ExtraFiles are passed to the process as fds 3, 4, ...
	ExtraFiles []*os.File
}

// DefaultDialTimeout bounds how long Starter waits for its launcher when ctx has no deadline.
const DefaultDialTimeout = 30 * time.Second

// Starter starts VM processes through the launcher serving Socket: the launcher-backed
// implementation of a driver's launcher seam (drivers/qmp's Launcher). Its Start:
//
//   - runs Path itself (no wrapper), as the launcher's child: in the launcher's session of its
//     own, cgroup and namespaces, reaped by the launcher;
//   - returns the pid in the caller's pid namespace, which the caller may pidfd_open and signal;
//   - fails if NetNS names another network namespace than the launcher's (the process can only
//     run in the launcher's);
//   - passes ExtraFiles by SCM_RIGHTS; they stay open in the caller.
//
// Path must name the binary as the launcher sees it (in a cluster: in the launcher's image).
type Starter struct {
	Socket string
	// DialTimeout bounds waiting for the launcher when ctx has no deadline (0:
	// DefaultDialTimeout).
	DialTimeout time.Duration
}

// NewStarter returns a Starter for the launcher serving socket (DomainSpec.sandbox.launcher_socket).
func NewStarter(socket string) *Starter { return &Starter{Socket: socket} }

// Start starts c through the launcher and returns its pid in the caller's pid namespace.
func (s *Starter) Start(ctx context.Context, c *Command) (int, error) {
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
		ns, err := nsInode(c.NetNS)
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
