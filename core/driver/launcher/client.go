package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Names of the files in a launcher's directory: the directory of
// DomainSpec.sandbox.launcher_socket.
const (
	// SocketName is the launcher's gRPC socket (launcherv1.Launcher).
	SocketName = "launcher.sock"
	// FilesSocketName is the descriptor side channel (SOCK_SEQPACKET; see the package
	// documentation).
	FilesSocketName = "launcher-files.sock"
)

// Client talks to one launcher over its unix socket.
type Client struct {
	conn        *grpc.ClientConn
	api         launcherv1.LauncherClient
	filesSocket string
	// launcherPid is the launcher's pid in this process's pid namespace (SO_PEERCRED of the last
	// connection), 0 if it is not visible here.
	launcherPid atomic.Int64
}

// Dial connects to the launcher serving socketPath (DomainSpec.sandbox.launcher_socket, which
// ends in SocketName), waiting for it to answer until ctx is done.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	c := &Client{filesSocket: filepath.Join(filepath.Dir(socketPath), FilesSocketName)}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socketPath)
		if err != nil {
			return nil, err
		}
		if pid := peerPid(conn); pid > 0 {
			c.launcherPid.Store(int64(pid))
		}
		return conn, nil
	}
	// A local socket that is not there yet (a launcher starting) is worth retrying soon.
	params := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}
	conn, err := grpc.NewClient("passthrough:///kubevisor-launcher", grpc.WithConnectParams(params),
		grpc.WithContextDialer(dialer), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial launcher %s: %w", socketPath, err)
	}
	c.conn, c.api = conn, launcherv1.NewLauncherClient(conn)
	if _, err := c.api.Info(ctx, &launcherv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("dial launcher %s: %w", socketPath, err)
	}
	return c, nil
}

// peerPid is the pid of the process at the other end of a unix socket, in this process's pid
// namespace (0 if it is not visible here).
func peerPid(conn net.Conn) int {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// API is the generated client, for what the methods here do not cover.
func (c *Client) API() launcherv1.LauncherClient { return c.api }

// LauncherPid is the launcher's pid in the caller's pid namespace (from SO_PEERCRED), 0 if it is
// not visible there. /proc/PID/ns/net of it is the sandbox's network namespace.
func (c *Client) LauncherPid() int { return int(c.launcherPid.Load()) }

// Info describes the launcher, its sandbox and its running or last process.
func (c *Client) Info(ctx context.Context) (*launcherv1.InfoResponse, error) {
	return c.api.Info(ctx, &launcherv1.InfoRequest{})
}

// StartOptions is a process to start (launcherv1.StartRequest, with descriptors).
type StartOptions struct {
	// Argv is the command line; Argv[0] without a slash is looked up in the launcher's PATH.
	Argv []string
	// Env is the whole environment; empty means the launcher's.
	Env []string
	// Dir is the working directory; empty means the launcher's.
	Dir string
	// LogPath (absolute, as the launcher sees it) receives stdout and stderr.
	LogPath string
	// Name says what the process is, for logs and the status.
	Name string
	// ExtraFiles become the process's fds 3, 4, ...; they are sent to the launcher (SCM_RIGHTS)
	// and stay open here.
	ExtraFiles []*os.File
	// Companions are started before the process and stopped once it exits
	// (launcherv1.StartRequest.companions). Start fails with FailedPrecondition, starting
	// nothing, when the launcher does not list FEATURE_COMPANIONS.
	Companions []*CompanionOptions
}

// CompanionOptions is a helper process of the VM process (launcherv1.Companion): Argv, Env,
// LogPath, Name and ExtraFiles are as in StartOptions; it runs in StartOptions.Dir.
type CompanionOptions struct {
	Argv       []string
	Env        []string
	LogPath    string
	Name       string
	ExtraFiles []*os.File
}

// Started is a process Start started.
type Started struct {
	// Process is as the launcher reports it: Pid in the launcher's pid namespace (what Signal and
	// Wait take), HostPid in the initial one if the launcher could tell.
	Process *launcherv1.Process
	// LocalPid is the process's pid in the caller's pid namespace, for kill(2) and pidfd_open(2);
	// 0 if it is not visible there, or it exited before it was found.
	LocalPid int
	// Companions are the companions started, in the order of StartOptions.Companions.
	Companions []*launcherv1.Process
}

// Start starts the launcher's process. It fails with FailedPrecondition while another process
// of the launcher runs, once the launcher is terminating, or when the program cannot be
// executed; with InvalidArgument for a malformed request.
func (c *Client) Start(ctx context.Context, o *StartOptions) (*Started, error) {
	req := &launcherv1.StartRequest{Argv: o.Argv, Env: o.Env, Dir: o.Dir, LogPath: o.LogPath, Name: o.Name}
	if len(o.Companions) > 0 {
		info, err := c.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("launcher info: %w", err)
		}
		if !slices.Contains(info.GetFeatures(), launcherv1.Feature_FEATURE_COMPANIONS) {
			return nil, status.Error(codes.FailedPrecondition, "the launcher does not start companion processes (FEATURE_COMPANIONS): it is older than this driver")
		}
	}
	for _, co := range o.Companions {
		comp := &launcherv1.Companion{Argv: co.Argv, Env: co.Env, LogPath: co.LogPath, Name: co.Name}
		if len(co.ExtraFiles) > 0 {
			token, err := sendFiles(ctx, c.filesSocket, co.ExtraFiles)
			if err != nil {
				return nil, err
			}
			comp.FilesToken = token
		}
		req.Companions = append(req.Companions, comp)
	}
	if len(o.ExtraFiles) > 0 {
		token, err := sendFiles(ctx, c.filesSocket, o.ExtraFiles)
		if err != nil {
			return nil, err
		}
		req.FilesToken = token
	}
	resp, err := c.api.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return &Started{Process: resp.GetProcess(), LocalPid: c.LocalPid(resp.GetProcess()), Companions: resp.GetCompanions()}, nil
}

// LocalPid resolves a process of the launcher to its pid in the caller's pid namespace: the same
// pid when the caller shares the launcher's pid namespace, else the child of the launcher (found
// by SO_PEERCRED) whose innermost pid and start time match. It returns 0 if that fails.
func (c *Client) LocalPid(p *launcherv1.Process) int {
	if ns, err := procfs.NSInode("/proc/self/ns/pid"); err == nil && ns == p.GetPidNamespace() {
		return int(p.GetPid())
	}
	if lp := c.LauncherPid(); lp > 0 {
		return procfs.ChildByInnerPid(lp, p.GetPid(), p.GetStartTime())
	}
	return 0
}

// Signal sends sig to the launcher's process pid (in the launcher's namespace).
func (c *Client) Signal(ctx context.Context, pid int, sig syscall.Signal) error {
	_, err := c.api.Signal(ctx, &launcherv1.SignalRequest{Pid: int64(pid), Signal: int32(sig)})
	return err
}

// Watch calls fn with the state of process pid: its current state, then its exit. It returns
// once the process exited (nil), fn failed, the launcher went away or ctx is done.
func (c *Client) Watch(ctx context.Context, pid int, fn func(*launcherv1.ProcessState) error) error {
	stream, err := c.api.Watch(ctx, &launcherv1.WatchRequest{Pid: int64(pid)})
	if err != nil {
		return err
	}
	for {
		st, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := fn(st); err != nil {
			return err
		}
		if !st.GetRunning() {
			return nil
		}
	}
}

// KillRunning kills the process the launcher runs, if one runs, and waits until it has exited
// (the launcher then ends its companions, and a later Start waits for them). It returns the
// process it killed, nil when none ran.
func (c *Client) KillRunning(ctx context.Context) (*launcherv1.Process, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("launcher info: %w", err)
	}
	st := info.GetProcess()
	if st == nil || !st.GetRunning() {
		return nil, nil
	}
	pid := int(st.GetProcess().GetPid())
	// FailedPrecondition: it exited meanwhile, which Wait sees.
	if err := c.Signal(ctx, pid, syscall.SIGKILL); err != nil && status.Code(err) != codes.FailedPrecondition {
		return nil, fmt.Errorf("kill %s (pid %d in the launcher): %w", st.GetProcess().GetName(), pid, err)
	}
	if _, err := c.Wait(ctx, pid); err != nil {
		return nil, fmt.Errorf("wait for %s (pid %d in the launcher): %w", st.GetProcess().GetName(), pid, err)
	}
	return st.GetProcess(), nil
}

// ErrLauncherGone is returned by Wait when the launcher exits before the process.
var ErrLauncherGone = errors.New("the launcher exited before its process")

// Wait waits for process pid to exit and returns its exit status.
func (c *Client) Wait(ctx context.Context, pid int) (*launcherv1.ExitStatus, error) {
	var exit *launcherv1.ExitStatus
	err := c.Watch(ctx, pid, func(st *launcherv1.ProcessState) error {
		exit = st.GetExit()
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case exit == nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, ErrLauncherGone
	}
	return exit, nil
}

// Events subscribes to the launcher's events. It returns once the launcher has registered the
// subscription, so that whatever happens next is received. Recv on the stream returns io.EOF when
// the launcher exits, another error when the connection breaks.
func (c *Client) Events(ctx context.Context) (grpc.ServerStreamingClient[launcherv1.Event], error) {
	stream, err := c.api.Events(ctx, &launcherv1.EventsRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := stream.Header(); err != nil {
		return nil, err
	}
	return stream, nil
}

// Exit ends the launcher; it fails (FailedPrecondition) while the launcher's process runs.
func (c *Client) Exit(ctx context.Context) error {
	_, err := c.api.Exit(ctx, &launcherv1.ExitRequest{})
	return err
}
