package launcher

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Bounds of the launcher's own waits.
const (
	// reapWait bounds waiting for the process to vanish after SIGKILL.
	reapWait = 10 * time.Second
	// stopServingWait bounds waiting for RPCs in flight when the launcher exits.
	stopServingWait = 2 * time.Second
	// historySize is how many exited processes Watch still knows.
	historySize = 8
	// subscriberBuffer is how many events a slow subscriber may lag before it is dropped.
	subscriberBuffer = 64
	// companionGrace is how long companions have to exit after SIGTERM, once their VM process
	// has exited, before they get SIGKILL.
	companionGrace = 2 * time.Second
)

// Run runs a launcher until it exits and returns its exit code: kubevisor-launcher's main. SIGTERM
// and SIGINT start termination (Server.Terminate).
func Run(cfg Config) int {
	s, err := New(cfg)
	if err != nil {
		return ExitStartFailed
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			s.Terminate(unix.SignalName(sig.(unix.Signal)))
		}
	}()
	return s.Serve()
}

// Server is a launcher: it serves launcherv1.Launcher and runs the VM process.
type Server struct {
	launcherv1.UnimplementedLauncherServer

	cfg   Config
	log   *slog.Logger
	lock  *os.File
	lis   net.Listener
	files *fileDrop
	grpc  *grpc.Server
	self  *launcherv1.InfoResponse // fixed fields of Info

	mu          sync.Mutex
	proc        *proc   // the running or last process
	history     []*proc // the last processes, newest last (proc among them)
	companions  []*proc // companions not reaped yet, of proc or of earlier processes
	startErr    error   // the last Start's failure, nil after a successful one
	subs        map[*subscriber]struct{}
	terminating bool
	deadline    time.Time
	outcome     *Status       // why the launcher exits, once decided
	done        chan struct{} // closed when outcome is set
	streamsDone chan struct{} // closed to end the streams when the launcher exits
}

// proc is a process the launcher started.
type proc struct {
	info  *launcherv1.Process
	pid   int
	pidfd int
	// exit is set (under Server.mu) once the process is reaped; done is closed then.
	exit *launcherv1.ExitStatus
	done chan struct{}
	// companions are the process's companions (StartRequest.companions).
	companions []*proc
}

func (p *proc) stateLocked() *launcherv1.ProcessState {
	return &launcherv1.ProcessState{Process: p.info, Running: p.exit == nil, Exit: p.exit}
}

type subscriber struct {
	ch      chan *launcherv1.Event
	dropped chan struct{}
}

// New prepares a launcher on cfg.Dir: it checks the directory, locks it and listens on its
// sockets. Errors are logged (and written as a start-failed status where that is safe).
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		if cfg.Logger == nil {
			cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
		}
		cfg.Logger.Error("launcher cannot start", "error", err)
		return nil, err
	}
	log := cfg.Logger
	fail := func(err error) (*Server, error) {
		log.Error("launcher cannot start", "dir", cfg.Dir, "error", err)
		return nil, err
	}
	if err := prepareDir(cfg.Dir); err != nil {
		return fail(err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return fail(err)
	}
	s, err := newServer(cfg, lock)
	if err != nil {
		st := &Status{Reason: ReasonStartFailed, Message: err.Error(), ExitCode: ExitStartFailed, VMI: cfg.VMI, Time: time.Now()}
		if werr := writeStatus(cfg.Dir, st); werr != nil {
			log.Error("write status", "error", werr)
		}
		_ = lock.Close()
		return fail(err)
	}
	return s, nil
}

// prepareDir creates dir (0700) if it is missing and checks that only its owner, this user, can
// use it.
func prepareDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
	}
	st := fi.Sys().(*syscall.Stat_t)
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return fmt.Errorf("directory %s is owned by uid %d, not by the launcher's uid %d", dir, st.Uid, euid)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("directory %s is accessible by group or others (mode %04o): it must be 0700, since whoever reaches the launcher's socket runs programs in the sandbox", dir, perm)
	}
	return nil
}

// lockDir takes the directory's lock, held as long as the launcher runs.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another launcher serves %s", dir)
		}
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	return f, nil
}

func newServer(cfg Config, lock *os.File) (*Server, error) {
	// What is left here is from a previous launcher of this directory, which is gone.
	for _, name := range []string{SocketName, FilesSocketName, StatusFileName} {
		if err := os.Remove(filepath.Join(cfg.Dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale %s: %w", name, err)
		}
	}
	self, err := selfInfo(cfg)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(cfg.Dir, SocketName)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	files, err := listenFiles(filepath.Join(cfg.Dir, FilesSocketName), cfg.Logger)
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, lock: lock, lis: lis, files: files, self: self,
		subs: map[*subscriber]struct{}{}, done: make(chan struct{}), streamsDone: make(chan struct{}),
	}
	s.grpc = grpc.NewServer()
	launcherv1.RegisterLauncherServer(s.grpc, s)
	return s, nil
}

func selfInfo(cfg Config) (*launcherv1.InfoResponse, error) {
	pidNS, err := procfs.NSInode("/proc/self/ns/pid")
	if err != nil {
		return nil, fmt.Errorf("pid namespace: %w", err)
	}
	netNS, err := procfs.NSInode("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	info := &launcherv1.InfoResponse{
		Pid: int64(os.Getpid()), PidNamespace: pidNS, NetNamespace: netNS,
		Cgroup: procfs.Cgroup(), Vmi: cfg.VMI, Dir: cfg.Dir,
		Features: []launcherv1.Feature{launcherv1.Feature_FEATURE_COMPANIONS},
	}
	if pidNS == procfs.InitPidNamespace {
		info.HostPid = info.Pid
	}
	return info, nil
}

// Serve serves until the launcher exits, and returns its exit code. It makes the launcher a child
// subreaper and reaps its children.
func (s *Server) Serve() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		s.log.Warn("cannot become a child subreaper", "error", err)
	}
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, unix.SIGCHLD)
	defer signal.Stop(sigchld)
	reaperDone := make(chan struct{})
	stopReaper := make(chan struct{})
	go func() {
		defer close(reaperDone)
		for {
			select {
			case <-sigchld:
				s.reap()
			case <-stopReaper:
				return
			}
		}
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.grpc.Serve(s.lis) }()
	go s.files.serve()
	s.log.Info("launcher serving", "socket", filepath.Join(s.cfg.Dir, SocketName), "pid", s.self.GetPid(),
		"net_namespace", s.self.GetNetNamespace(), "cgroup", s.self.GetCgroup(),
		"grace_period", s.cfg.GracePeriod.String(), "kill_margin", s.cfg.KillMargin.String())

	select {
	case <-s.done:
	case err := <-serveErr:
		s.finish(ReasonStartFailed, fmt.Sprintf("serve: %v", err), ExitStartFailed)
	}

	close(s.streamsDone)
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopServingWait):
		s.grpc.Stop()
	}
	s.files.close()
	s.killChildren()
	close(stopReaper)
	<-reaperDone

	s.mu.Lock()
	st := s.outcome
	s.mu.Unlock()
	if err := writeStatus(s.cfg.Dir, st); err != nil {
		s.log.Error("write status", "error", err)
	}
	_ = os.Remove(filepath.Join(s.cfg.Dir, SocketName))
	_ = s.lock.Close()
	attrs := []any{"reason", st.Reason, "message", st.Message, "exit_code", st.ExitCode}
	if p := st.Process; p != nil {
		attrs = append(attrs, "process", p.Name, "pid", p.Pid)
		if p.Exit != nil {
			attrs = append(attrs, "process_exit", p.Exit.Description)
		}
	}
	s.log.Info("launcher exiting", attrs...)
	return st.ExitCode
}

// finish decides why the launcher exits (the first decision stands).
func (s *Server) finish(reason, message string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finishLocked(reason, message, code)
}

func (s *Server) finishLocked(reason, message string, code int) {
	if s.outcome != nil {
		return
	}
	st := &Status{Reason: reason, Message: message, ExitCode: code, VMI: s.cfg.VMI, Time: time.Now()}
	if s.proc != nil {
		st.Process = statusProcess(s.proc.stateLocked())
	}
	s.outcome = st
	close(s.done)
}

// Terminate starts the launcher's termination, as SIGTERM does (cause names why, "SIGTERM"):
// subscribers get TERMINATING; the process has until the deadline to exit, then it is killed; the
// launcher then exits. Calling it again changes nothing.
func (s *Server) Terminate(cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terminating || s.outcome != nil {
		s.log.Info("already terminating", "cause", cause)
		return
	}
	s.terminating = true
	s.deadline = time.Now().Add(s.cfg.GracePeriod - s.cfg.KillMargin)
	s.publishLocked(&launcherv1.Event{
		Type: launcherv1.EventType_EVENT_TYPE_TERMINATING, Time: timestamppb.Now(),
		Deadline: timestamppb.New(s.deadline), GracePeriod: durationpb.New(s.cfg.GracePeriod),
	})
	p := s.proc
	if p == nil || p.exit != nil {
		s.log.Info("terminating with no process running", "cause", cause)
		if s.startErr != nil {
			s.finishLocked(ReasonStartFailed, fmt.Sprintf("%s after a failed start: %v", cause, s.startErr), ExitStartFailed)
			return
		}
		s.finishLocked(ReasonLauncherTerminated, fmt.Sprintf("%s with no process running", cause), ExitOK)
		return
	}
	s.log.Info("terminating: the process has until the deadline to exit", "cause", cause,
		"pid", p.pid, "deadline", s.deadline.Format(time.RFC3339Nano))
	go s.forceStop(p, s.deadline)
}

// forceStop waits for p to exit until deadline, then kills it; either way the launcher then
// exits.
func (s *Server) forceStop(p *proc, deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-p.done:
		s.mu.Lock()
		desc := p.exit.GetDescription()
		s.mu.Unlock()
		s.finish(ReasonVMExited, fmt.Sprintf("%s (pid %d) exited before the deadline: %s", p.info.GetName(), p.pid, desc), ExitOK)
		return
	case <-t.C:
	}
	s.log.Warn("process still running at the deadline, sending SIGTERM", "pid", p.pid)
	s.signalGroup(p, unix.SIGTERM)
	if !waitClosed(p.done, s.cfg.KillMargin/2) {
		s.log.Warn("process still running, sending SIGKILL", "pid", p.pid)
		s.signalGroup(p, unix.SIGKILL)
		if !waitClosed(p.done, reapWait) {
			s.log.Error("process did not exit after SIGKILL", "pid", p.pid)
		}
	}
	s.mu.Lock()
	desc := p.exit.GetDescription()
	s.mu.Unlock()
	if desc == "" {
		desc = "still running"
	}
	s.finish(ReasonKilledAtDeadline, fmt.Sprintf("%s (pid %d) still ran at the deadline, %s after SIGTERM, and was forced down: %s",
		p.info.GetName(), p.pid, s.cfg.GracePeriod-s.cfg.KillMargin, desc), ExitKilledAtDeadline)
}

// signalGroup signals p and its process group. The group is signalled only while p is not
// reaped: until then its pid names p's group and no other.
func (s *Server) signalGroup(p *proc, sig unix.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signalGroupLocked(p, sig)
}

func (s *Server) signalGroupLocked(p *proc, sig unix.Signal) {
	if p.exit != nil {
		return
	}
	_ = unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
	_ = unix.Kill(-p.pid, sig)
}

// reap reaps the launcher's exited children: its process, and orphans it adopted as a subreaper.
// All reaping happens here, under s.mu, so that an unreaped process's pid stays valid for any
// code holding s.mu.
func (s *Server) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if p := s.proc; p != nil && p.exit == nil {
			var si unix.Siginfo
			err := unix.Waitid(unix.P_PIDFD, p.pidfd, &si, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
			if err == nil && si.Signo != 0 {
				// A zombie still holds its pid, so its group can be killed safely: what the
				// process leaves behind does not outlive it.
				_ = unix.Kill(-p.pid, unix.SIGKILL)
				var ws unix.WaitStatus
				if pid, err := unix.Wait4(p.pid, &ws, unix.WNOHANG, nil); err == nil && pid == p.pid {
					s.exitedLocked(p, ws)
					continue
				}
			}
		}
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if p := s.proc; p != nil && p.exit == nil && pid == p.pid {
			s.exitedLocked(p, ws) // exited between the check above and this wait
			continue
		}
		if i := slices.IndexFunc(s.companions, func(c *proc) bool { return c.pid == pid }); i >= 0 {
			c := s.companions[i]
			s.companions = slices.Delete(s.companions, i, i+1)
			code, sig, core, desc := exitStatus(ws)
			c.exit = &launcherv1.ExitStatus{Code: code, Signal: sig, CoreDumped: core, Time: timestamppb.Now(), Description: desc}
			_ = unix.Close(c.pidfd)
			close(c.done)
			s.log.Info("companion exited", "name", c.info.GetName(), "pid", pid, "status", desc)
			continue
		}
		_, _, _, desc := exitStatus(ws)
		s.log.Debug("reaped an adopted process", "pid", pid, "status", desc)
	}
}

func (s *Server) exitedLocked(p *proc, ws unix.WaitStatus) {
	code, sig, core, desc := exitStatus(ws)
	p.exit = &launcherv1.ExitStatus{Code: code, Signal: sig, CoreDumped: core, Time: timestamppb.Now(), Description: desc}
	_ = unix.Close(p.pidfd)
	close(p.done)
	s.log.Info("process exited", "name", p.info.GetName(), "pid", p.pid, "status", desc, "terminating", s.terminating)
	for _, c := range p.companions {
		s.signalGroupLocked(c, unix.SIGTERM)
		go func() {
			if !waitClosed(c.done, companionGrace) {
				s.log.Warn("companion still running after SIGTERM, sending SIGKILL", "name", c.info.GetName(), "pid", c.pid)
				s.signalGroup(c, unix.SIGKILL)
			}
		}()
	}
	s.publishLocked(&launcherv1.Event{
		Type: launcherv1.EventType_EVENT_TYPE_EXITED, Time: p.exit.GetTime(), Process: p.info, Exit: p.exit,
	})
}

// killChildren kills and reaps whatever children the launcher has left (its process, if a kill
// failed; processes it adopted) as it exits. Only the launcher reaps its children, under s.mu, so
// their pids are safe to signal there.
func (s *Server) killChildren() {
	deadline := time.Now().Add(reapWait)
	for first := true; ; first = false {
		s.mu.Lock()
		kids := procfs.Children(os.Getpid())
		for _, pid := range kids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		s.mu.Unlock()
		if len(kids) == 0 {
			return
		}
		if first {
			s.log.Warn("killing processes left at exit", "pids", kids)
		}
		s.reap()
		if time.Now().After(deadline) {
			s.log.Error("processes left at exit did not go away", "pids", kids)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitClosed(ch <-chan struct{}, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
