package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

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
func (s *Server) Start(ctx context.Context, req *launcherv1.StartRequest) (*launcherv1.StartResponse, error) {
	if err := checkStart(req); err != nil {
		return nil, err
	}
	var taken [][]*os.File
	defer func() { // the processes have their own copies
		for _, files := range taken {
			closeAll(files)
		}
	}()
	take := func(field, token string) ([]*os.File, error) {
		if token == "" {
			return nil, nil
		}
		files := s.files.take(token)
		if files == nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown or expired", field)
		}
		taken = append(taken, files)
		return files, nil
	}
	files, err := take("files_token", req.GetFilesToken())
	if err != nil {
		return nil, err
	}
	compFiles := make([][]*os.File, len(req.GetCompanions()))
	for i, c := range req.GetCompanions() {
		if compFiles[i], err = take(fmt.Sprintf("companions[%d].files_token", i), c.GetFilesToken()); err != nil {
			return nil, err
		}
	}
	if err := s.waitCompanions(ctx); err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.terminating || s.outcome != nil:
		return nil, status.Error(codes.FailedPrecondition, "the launcher is terminating")
	case s.proc != nil && s.proc.exit == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "%s (pid %d) is running: a launcher runs one process at a time",
			s.proc.info.GetName(), s.proc.pid)
	case len(s.companions) > 0:
		return nil, status.Errorf(codes.FailedPrecondition, "%d companion(s) of the last process did not exit", len(s.companions))
	}
	var comps []*proc
	fail := func(what string, err error) (*launcherv1.StartResponse, error) {
		for _, c := range comps {
			s.signalGroupLocked(c, unix.SIGKILL)
		}
		s.startErr = fmt.Errorf("start %s: %w", what, err)
		s.log.Error("start failed", "name", req.GetName(), "argv", req.GetArgv(), "error", s.startErr)
		return nil, status.Error(codes.FailedPrecondition, s.startErr.Error())
	}
	for i, c := range req.GetCompanions() {
		cp, err := s.startLocked(c.GetArgv(), c.GetEnv(), req.GetDir(), c.GetLogPath(), c.GetName(), compFiles[i])
		if err != nil {
			return fail(fmt.Sprintf("companion %s", c.GetArgv()[0]), err)
		}
		comps = append(comps, cp)
		s.companions = append(s.companions, cp)
		s.log.Info("companion started", "name", cp.info.GetName(), "pid", cp.pid, "argv", c.GetArgv(), "log", c.GetLogPath(), "files", len(compFiles[i]))
	}
	p, err := s.startLocked(req.GetArgv(), req.GetEnv(), req.GetDir(), req.GetLogPath(), req.GetName(), files)
	if err != nil {
		return fail(req.GetArgv()[0], err)
	}
	p.companions = comps
	s.startErr = nil
	s.proc = p
	s.history = append(s.history, p)
	if len(s.history) > historySize {
		s.history = s.history[1:]
	}
	s.log.Info("process started", "name", p.info.GetName(), "pid", p.pid, "argv", req.GetArgv(), "log", req.GetLogPath(), "files", len(files))
	s.publishLocked(&launcherv1.Event{Type: launcherv1.EventType_EVENT_TYPE_STARTED, Time: p.info.GetStartedAt(), Process: p.info})
	resp := &launcherv1.StartResponse{Process: p.info}
	for _, c := range comps {
		resp.Companions = append(resp.Companions, c.info)
	}
	return resp, nil
}

// waitCompanions waits for the companions of the last process to be gone: they were told to
// stop when it exited, and are killed companionGrace later.
func (s *Server) waitCompanions(ctx context.Context) error {
	s.mu.Lock()
	if s.proc != nil && s.proc.exit == nil {
		s.mu.Unlock()
		return nil // Start refuses: the process runs, and its companions with it
	}
	comps := append([]*proc(nil), s.companions...)
	s.mu.Unlock()
	if len(comps) == 0 {
		return nil
	}
	t := time.NewTimer(companionGrace + reapWait)
	defer t.Stop()
	for _, c := range comps {
		select {
		case <-c.done:
		case <-t.C:
			return status.Errorf(codes.FailedPrecondition, "companion %s (pid %d) of the last process did not exit", c.info.GetName(), c.pid)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

func checkStart(req *launcherv1.StartRequest) error {
	if err := checkProcess("", req.GetArgv(), req.GetEnv(), req.GetLogPath()); err != nil {
		return err
	}
	if req.GetDir() != "" && !filepath.IsAbs(req.GetDir()) {
		return status.Errorf(codes.InvalidArgument, "dir: %q is not an absolute path", req.GetDir())
	}
	for i, c := range req.GetCompanions() {
		if err := checkProcess(fmt.Sprintf("companions[%d].", i), c.GetArgv(), c.GetEnv(), c.GetLogPath()); err != nil {
			return err
		}
	}
	return nil
}

func checkProcess(prefix string, argv, env []string, logPath string) error {
	switch {
	case len(argv) == 0 || argv[0] == "":
		return status.Errorf(codes.InvalidArgument, "%sargv: empty", prefix)
	case logPath == "" || !filepath.IsAbs(logPath):
		return status.Errorf(codes.InvalidArgument, "%slog_path: %q is not an absolute path", prefix, logPath)
	}
	for i, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return status.Errorf(codes.InvalidArgument, "%senv[%d]: %q is not KEY=VALUE", prefix, i, kv)
		}
	}
	return nil
}

// startLocked forks and execs a process.
func (s *Server) startLocked(argv, env []string, dir, logPath, name string, files []*os.File) (*proc, error) {
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
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	fds := []uintptr{devnull.Fd(), logf.Fd(), logf.Fd()}
	for _, f := range files {
		fds = append(fds, f.Fd())
	}
	if len(env) == 0 {
		env = os.Environ()
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir: dir, Env: env, Files: fds,
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
