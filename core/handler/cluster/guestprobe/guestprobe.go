// Package guestprobe is the guest probe socket: how a VMI's exec and guestAgentPing probes,
// which the kubelet runs as kubevisor-probe (cmd/kubevisor-probe) in the launcher pod's compute
// container, reach the node handler, which asks the guest agent through the hypervisor driver.
//
// The handler serves the socket (Listen) at layout.GuestProbeSocket, in a directory it makes 0700
// and gives to the launcher's user, so that only the compute container (and root on the node)
// reaches it. The protocol is one exchange per connection: the client writes a Request as one
// JSON line, the server answers a Result as one JSON line and closes. The package imports only
// the standard library and golang.org/x/sys/unix, so that the launcher image's static
// kubevisor-probe links it.
package guestprobe

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Request is what a probe asks: a ping of the guest agent, or a command to run in the guest.
type Request struct {
	// Ping asks whether the guest agent answers.
	Ping bool `json:"ping,omitempty"`
	// Command is the command to run in the guest (an exec probe): the program and its arguments.
	Command []string `json:"command,omitempty"`
	// TimeoutMillis bounds the handler's work for the request, in milliseconds.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// Timeout is the request's timeout, DefaultTimeout when it sets none, MaxTimeout at most.
func (r Request) Timeout() time.Duration {
	d := time.Duration(r.TimeoutMillis) * time.Millisecond
	if d <= 0 {
		return DefaultTimeout
	}
	return min(d, MaxTimeout)
}

// DefaultTimeout is a Request's timeout when it sets none, and MaxTimeout the longest one the
// server takes.
const (
	DefaultTimeout = time.Second
	MaxTimeout     = 5 * time.Minute
)

// Result is the server's answer.
type Result struct {
	// Success is true when the probe succeeded: the agent answered the ping, or the command
	// exited with status 0.
	Success bool `json:"success"`
	// Reason says, in one line, why the probe failed.
	Reason string `json:"reason,omitempty"`
	// Stdout and Stderr are what the guest command wrote.
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
}

// maxRequest bounds a request line.
const maxRequest = 1 << 20

// Ask sends req to the server at path and returns its answer. ctx bounds the whole exchange.
func Ask(ctx context.Context, path string, req Request) (Result, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Result{}, fmt.Errorf("cannot reach the node handler: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	line, err := json.Marshal(req)
	if err != nil {
		return Result{}, err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return Result{}, fmt.Errorf("node handler: %w", err)
	}
	reply, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		// The connection's deadline is the context's: the read may time out just before the
		// context's own timer says it is done.
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return Result{}, fmt.Errorf("the node handler did not answer in time: %w", context.DeadlineExceeded)
		}
		return Result{}, fmt.Errorf("node handler: %w", err)
	}
	var res Result
	if err := json.Unmarshal(reply, &res); err != nil {
		return Result{}, fmt.Errorf("node handler: %w", err)
	}
	return res, nil
}

// ProbeFunc answers one request within ctx (whose deadline is the request's timeout).
type ProbeFunc func(ctx context.Context, req Request) Result

// Server serves a guest probe socket.
type Server struct {
	path   string
	l      *net.UnixListener
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Listen serves probe at path, a socket in a directory of its own (dir := filepath.Dir(path),
// layout.GuestProbeDir): it removes whatever dir holds (a socket of an earlier handler process),
// makes dir 0700, binds the socket in it and gives both to uid:gid (the launcher's user; -1
// keeps the owner). The directory is opened without following a symbolic link and the socket
// bound and chowned through that descriptor, so that what the pod put at dir (it can write its
// VMI directory) cannot point the handler elsewhere.
func Listen(path string, uid, gid int, probe ProbeFunc) (*Server, error) {
	dir, name := filepath.Split(path)
	dir = filepath.Clean(dir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("guest probe socket: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("guest probe socket: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guest probe socket: open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: fmt.Sprintf("/proc/self/fd/%d/%s", fd, name)})
	if err != nil {
		return nil, fmt.Errorf("guest probe socket: %w", err)
	}
	// The name it was bound under means nothing once fd is closed: Close removes path itself.
	l.SetUnlinkOnClose(false)
	if uid >= 0 || gid >= 0 {
		err := unix.Fchownat(fd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil {
			err = unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
		}
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("guest probe socket: give it to %d:%d: %w", uid, gid, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{path: path, l: l, cancel: cancel}
	s.wg.Go(func() { s.accept(ctx, probe) })
	return s, nil
}

func (s *Server) accept(ctx context.Context, probe ProbeFunc) {
	for {
		conn, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { serve(ctx, conn, probe) })
	}
}

// requestWithin bounds reading a request.
const requestWithin = 5 * time.Second

func serve(ctx context.Context, conn net.Conn, probe ProbeFunc) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(requestWithin))
	line, err := bufio.NewReader(&limited{conn, maxRequest}).ReadBytes('\n')
	if err != nil {
		return
	}
	var req Request
	var res Result
	if err := json.Unmarshal(line, &req); err != nil {
		res = Result{Reason: "bad request: " + err.Error()}
	} else {
		pctx, cancel := context.WithTimeout(ctx, req.Timeout())
		res = probe(pctx, req)
		cancel()
	}
	out, _ := json.Marshal(res)
	_ = conn.SetWriteDeadline(time.Now().Add(requestWithin))
	_, _ = conn.Write(append(out, '\n'))
}

// limited reads at most n bytes from r, then fails.
type limited struct {
	r net.Conn
	n int
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("request too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// Close stops serving: it cancels the requests in progress, waits for them, and removes the
// socket.
func (s *Server) Close() error {
	err := s.l.Close()
	s.cancel()
	s.wg.Wait()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}
