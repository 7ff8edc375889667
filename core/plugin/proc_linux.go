//go:build linux

package plugin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts a plugin in its own process group, so that signals sent to the host's group
// (a terminal's ^C or ^\, a supervisor stopping the host) do not reach drivers, which are meant
// to outlive a host restart.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// errProcessGone is returned by openProc for a pid with no live process.
var errProcessGone = errors.New("process is gone")

// proc watches one plugin process through a pidfd, which, unlike a pid, never names another
// process once this one is gone, and works for a process that is not our child (a reattached
// plugin). Without pidfds (Linux < 5.3) it falls back to polling /proc.
type proc struct {
	pid int

	mu     sync.Mutex
	fd     int // pidfd, or -1
	closed bool
}

// openProc opens a handle on a live process. A zombie counts as gone.
func openProc(pid int) (*proc, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil, errProcessGone
	case errors.Is(err, unix.ENOSYS):
		fd = -1
	case err != nil:
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	p := &proc{pid: pid, fd: fd}
	if st, _, err := procStat(pid); err != nil || st == 'Z' || st == 'X' {
		p.close()
		return nil, errProcessGone
	}
	return p, nil
}

// wait blocks until the process has exited (it may still be a zombie). Call it from one
// goroutine only; close the handle after it returns.
func (p *proc) wait() {
	if p.fd >= 0 {
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == nil && n > 0 {
				return // a pidfd is readable once its process has exited
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				break // cannot wait on the pidfd: poll /proc instead
			}
		}
	}
	for {
		if st, _, err := procStat(p.pid); err != nil || st == 'Z' || st == 'X' {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kill sends SIGKILL. It does nothing once the handle is closed, so it can never hit another
// process that reused the pid.
func (p *proc) kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var err error
	if p.fd >= 0 {
		err = unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0)
	} else {
		err = unix.Kill(p.pid, unix.SIGKILL)
	}
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// reap collects the exit status of an exited process that is our child without being an
// exec.Cmd's (a plugin reattached by this process, when it is a child subreaper or re-executed
// itself). ok is false when it is not our child.
func (p *proc) reap() (status string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", false
	}
	if p.fd >= 0 {
		// Ask through the pidfd, without reaping, whether it is our exited child: only then is
		// its pid safe to wait for (no other process can have it before we reap it).
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, p.fd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == nil && info.Signo == 0 || err != nil && !errors.Is(err, unix.EINVAL) {
			return "", false // not exited, or not our child
		}
	}
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
	if err != nil || pid != p.pid {
		return "", false
	}
	return describeWaitStatus(ws), true
}

func describeWaitStatus(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		return "signal: " + ws.Signal().String()
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}

func (p *proc) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	if p.fd >= 0 {
		_ = unix.Close(p.fd)
	}
}

// procStat returns a process's state letter and start time (clock ticks after boot) from
// /proc/<pid>/stat. Together with the boot id, pid and start time name one process for ever.
func procStat(pid int) (state byte, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces and parentheses: split after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state); the start time is field 22.
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: start time: %w", pid, err)
	}
	return f[0][0], start, nil
}

// bootID identifies the running kernel boot, so that a pid and start time recorded before a
// reboot are never taken for a process of this boot.
func bootID() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// exeSHA256 hashes the executable a process runs: the image it was started from, even if the
// file on disk was replaced or removed since.
func exeSHA256(pid int) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockFile takes an exclusive, non-blocking flock on path, so two hosts never share a state
// directory. The lock goes with the process (and is not inherited by plugins: the file is
// close-on-exec).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errors.New("in use by another host")
		}
		return nil, err
	}
	return f, nil
}
