package qmp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// process is a running VM process the driver watches through a pidfd, which, unlike a pid,
// cannot come to name another process.
type process struct {
	pid   int
	pidfd int
}

// openProcess returns the process with pid, or an error when it is gone.
func openProcess(pid int) (*process, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return &process{pid: pid, pidfd: fd}, nil
}

// exited reports whether the process has exited, waiting up to timeout (0: do not wait).
func (p *process) exited(timeout time.Duration) bool {
	ms := int(timeout / time.Millisecond)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// wait blocks until the process exits (true) or stop is closed (false).
func (p *process) wait(stop <-chan struct{}) bool {
	for {
		if p.exited(200 * time.Millisecond) {
			return true
		}
		select {
		case <-stop:
			return false
		default:
		}
	}
}

func (p *process) kill() error {
	err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

func (p *process) close() { _ = unix.Close(p.pidfd) }

// isQEMUOf reports whether pid is a live QEMU whose command line names pidFile: the check that a
// pid read from a record still is the VM's process.
func isQEMUOf(pid int, pidFile string) bool {
	if pid <= 0 {
		return false
	}
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(raw) == 0 { // gone, or a zombie
		return false
	}
	args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
	if !strings.Contains(filepath.Base(args[0]), "qemu") {
		return false
	}
	for i := 1; i+1 < len(args); i++ {
		if args[i] == "-pidfile" && args[i+1] == pidFile {
			return true
		}
	}
	return false
}

var procFD = regexp.MustCompile(`^/proc/(self|[0-9]+)/fd/([0-9]+)$`)

// openPassed opens a descriptor path of the spec (NIC.tap_fd_path) for passing to QEMU. A
// /proc/PID/fd/N path is duplicated (pidfd_getfd, or dup for self), not opened again: opening
// it would give a new, unattached file of the device (/dev/net/tun), not the tap behind the
// descriptor. Any other path is opened read-write.
func openPassed(path string) (*os.File, error) {
	m := procFD.FindStringSubmatch(path)
	if m == nil {
		return os.OpenFile(path, os.O_RDWR, 0)
	}
	n, _ := strconv.Atoi(m[2])
	var fd int
	var err error
	if m[1] == "self" || m[1] == strconv.Itoa(os.Getpid()) {
		fd, err = unix.FcntlInt(uintptr(n), unix.F_DUPFD_CLOEXEC, 0)
	} else {
		pid, _ := strconv.Atoi(m[1])
		var pidfd int
		if pidfd, err = unix.PidfdOpen(pid, 0); err == nil {
			fd, err = unix.PidfdGetfd(pidfd, n, 0)
			_ = unix.Close(pidfd)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("duplicate %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// readPIDFile returns the pid in a QEMU pidfile, or 0.
func readPIDFile(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0
	}
	return pid
}
