package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

var _ launcherv1.LauncherServer = (*Server)(nil)

// Info implements launcherv1.LauncherServer.
func (s *Server) Info(context.Context, *launcherv1.InfoRequest) (*launcherv1.InfoResponse, error) {
	info := proto.Clone(s.self).(*launcherv1.InfoResponse)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		info.Process = s.proc.stateLocked()
	}
	info.Terminating = s.terminating
	if s.terminating {
		info.Deadline = timestamppb.New(s.deadline)
	}
	return info, nil
}

// Start implements launcherv1.LauncherServer.
func (s *Server) Start(_ context.Context, req *launcherv1.StartRequest) (*launcherv1.StartResponse, error) {
	if err := checkStart(req); err != nil {
		return nil, err
	}
	var files []*os.File
	if req.GetFilesToken() != "" {
		if files = s.files.take(req.GetFilesToken()); files == nil {
			return nil, status.Error(codes.InvalidArgument, "files_token: unknown or expired")
		}
	}
	defer closeAll(files) // the process has its own copies

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.terminating || s.outcome != nil:
		return nil, status.Error(codes.FailedPrecondition, "the launcher is terminating")
	case s.proc != nil && s.proc.exit == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "%s (pid %d) is running: a launcher runs one process at a time",
			s.proc.info.GetName(), s.proc.pid)
	}
	p, err := s.startLocked(req, files)
	if err != nil {
		s.startErr = fmt.Errorf("start %s: %w", req.GetArgv()[0], err)
		s.log.Error("start failed", "name", req.GetName(), "argv", req.GetArgv(), "error", err)
		return nil, status.Error(codes.FailedPrecondition, s.startErr.Error())
	}
	s.startErr = nil
	s.proc = p
	s.history = append(s.history, p)
	if len(s.history) > historySize {
		s.history = s.history[1:]
	}
	s.log.Info("process started", "name", p.info.GetName(), "pid", p.pid, "argv", req.GetArgv(), "log", req.GetLogPath(), "files", len(files))
	s.publishLocked(&launcherv1.Event{Type: launcherv1.EventType_EVENT_TYPE_STARTED, Time: p.info.GetStartedAt(), Process: p.info})
	return &launcherv1.StartResponse{Process: p.info}, nil
}

func checkStart(req *launcherv1.StartRequest) error {
	switch {
	case len(req.GetArgv()) == 0 || req.GetArgv()[0] == "":
		return status.Error(codes.InvalidArgument, "argv: empty")
	case req.GetLogPath() == "" || !filepath.IsAbs(req.GetLogPath()):
		return status.Errorf(codes.InvalidArgument, "log_path: %q is not an absolute path", req.GetLogPath())
	case req.GetDir() != "" && !filepath.IsAbs(req.GetDir()):
		return status.Errorf(codes.InvalidArgument, "dir: %q is not an absolute path", req.GetDir())
	}
	for i, kv := range req.GetEnv() {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return status.Errorf(codes.InvalidArgument, "env[%d]: %q is not KEY=VALUE", i, kv)
		}
	}
	return nil
}

// startLocked forks and execs the process of req.
func (s *Server) startLocked(req *launcherv1.StartRequest, files []*os.File) (*proc, error) {
	argv := req.GetArgv()
	path := argv[0]
	if !strings.Contains(path, "/") {
		found, err := exec.LookPath(path)
		if err != nil {
			return nil, err
		}
		path = found
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	logf, err := os.OpenFile(req.GetLogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	fds := []uintptr{devnull.Fd(), logf.Fd(), logf.Fd()}
	for _, f := range files {
		fds = append(fds, f.Fd())
	}
	env := req.GetEnv()
	if len(env) == 0 {
		env = os.Environ()
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir: req.GetDir(), Env: env, Files: fds,
		Sys: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, PidFD: &pidfd},
	}
	pid, err := spawn(path, argv, attr)
	if err != nil {
		return nil, err
	}
	if pidfd < 0 { // no CLONE_PIDFD; the child is not reaped before s.mu is released
		if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
		}
	}
	started, err := procfs.StartTime(pid)
	if err != nil {
		s.log.Warn("cannot read the process's start time", "pid", pid, "error", err)
	}
	name := req.GetName()
	if name == "" {
		name = filepath.Base(argv[0])
	}
	info := &launcherv1.Process{
		Pid: int64(pid), PidNamespace: s.self.GetPidNamespace(), StartTime: started, Name: name,
		StartedAt: timestamppb.Now(),
	}
	if s.self.GetHostPid() != 0 {
		info.HostPid = int64(pid)
	}
	return &proc{info: info, pid: pid, pidfd: pidfd, done: make(chan struct{})}, nil
}

// lookup finds a process the launcher started, by pid.
func (s *Server) lookupLocked(pid int64) *proc {
	for i := len(s.history) - 1; i >= 0; i-- {
		if int64(s.history[i].pid) == pid {
			return s.history[i]
		}
	}
	return nil
}

// Signal implements launcherv1.LauncherServer.
func (s *Server) Signal(_ context.Context, req *launcherv1.SignalRequest) (*launcherv1.SignalResponse, error) {
	sig := unix.Signal(req.GetSignal())
	if sig <= 0 || sig > 64 {
		return nil, status.Errorf(codes.InvalidArgument, "signal: %d is not a signal", req.GetSignal())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.lookupLocked(req.GetPid())
	switch {
	case p == nil:
		return nil, status.Errorf(codes.NotFound, "pid %d: not a process of this launcher", req.GetPid())
	case p.exit != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "pid %d has exited (%s)", p.pid, p.exit.GetDescription())
	}
	if err := unix.PidfdSendSignal(p.pidfd, sig, nil, 0); err != nil {
		return nil, status.Errorf(codes.Internal, "signal pid %d: %v", p.pid, err)
	}
	s.log.Info("signalled process", "pid", p.pid, "signal", sig.String())
	return &launcherv1.SignalResponse{}, nil
}

// Watch implements launcherv1.LauncherServer.
func (s *Server) Watch(req *launcherv1.WatchRequest, stream grpc.ServerStreamingServer[launcherv1.ProcessState]) error {
	s.mu.Lock()
	p := s.lookupLocked(req.GetPid())
	if p == nil {
		s.mu.Unlock()
		return status.Errorf(codes.NotFound, "pid %d: not a process of this launcher", req.GetPid())
	}
	st := p.stateLocked()
	s.mu.Unlock()
	if err := stream.Send(st); err != nil || !st.GetRunning() {
		return err
	}
	select {
	case <-p.done:
	case <-stream.Context().Done():
		return nil
	case <-s.streamsDone:
		select {
		case <-p.done:
		default:
			return nil
		}
	}
	s.mu.Lock()
	st = p.stateLocked()
	s.mu.Unlock()
	return stream.Send(st)
}

// Events implements launcherv1.LauncherServer.
func (s *Server) Events(_ *launcherv1.EventsRequest, stream grpc.ServerStreamingServer[launcherv1.Event]) error {
	sub := &subscriber{ch: make(chan *launcherv1.Event, subscriberBuffer), dropped: make(chan struct{})}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	if s.terminating {
		sub.ch <- &launcherv1.Event{
			Type: launcherv1.EventType_EVENT_TYPE_TERMINATING, Time: timestamppb.Now(),
			Deadline: timestamppb.New(s.deadline), GracePeriod: durationpb.New(s.cfg.GracePeriod),
		}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	if err := stream.SendHeader(metadata.MD{}); err != nil { // tells the client it is subscribed
		return err
	}
	for {
		select {
		case ev := <-sub.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-sub.dropped:
			return status.Error(codes.ResourceExhausted, "subscriber fell behind")
		case <-stream.Context().Done():
			return nil
		case <-s.streamsDone:
			for { // what is queued still goes out: the last EXITED
				select {
				case ev := <-sub.ch:
					if err := stream.Send(ev); err != nil {
						return err
					}
				default:
					return nil
				}
			}
		}
	}
}

func (s *Server) publishLocked(ev *launcherv1.Event) {
	for sub := range s.subs {
		select {
		case sub.ch <- ev:
		default:
			delete(s.subs, sub)
			close(sub.dropped)
		}
	}
}

// Exit implements launcherv1.LauncherServer.
func (s *Server) Exit(context.Context, *launcherv1.ExitRequest) (*launcherv1.ExitResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.proc; p != nil && p.exit == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s (pid %d) is running: stop it first", p.info.GetName(), p.pid)
	}
	s.log.Info("exit requested")
	if s.startErr != nil {
		s.finishLocked(ReasonStartFailed, fmt.Sprintf("exit requested after a failed start: %v", s.startErr), ExitStartFailed)
	} else {
		s.finishLocked(ReasonLauncherTerminated, "exit requested with no process running", ExitOK)
	}
	return &launcherv1.ExitResponse{}, nil
}
