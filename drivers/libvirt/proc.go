package libvirt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	golibvirt "libvirt.org/go/libvirt"
)

// process is a VM's daemon, watched through a pidfd, which cannot come to name another process.
type process struct {
	pid   int
	pidfd int
}

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

func (p *process) kill() error {
	err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

func (p *process) close() { _ = unix.Close(p.pidfd) }

// isDaemonOf reports whether pid is a live libvirtd serving dm: the check that a pid read from a
// record still is that daemon before it is killed.
func isDaemonOf(pid int, dm daemon) bool {
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline"))
	if err != nil || !bytes.Contains(cmdline, []byte("libvirtd")) {
		return false
	}
	env, err := os.ReadFile(filepath.Join(proc, "environ"))
	if err != nil {
		return false
	}
	return bytes.Contains(env, []byte("\x00XDG_RUNTIME_DIR="+filepath.Join(dm.dir, "r")+"\x00"))
}

// isQEMUOf reports whether pid is a live QEMU that dm's daemon started: its command line names
// the daemon's directory (its monitor socket is there).
func isQEMUOf(pid int, dm daemon) bool {
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return err == nil && bytes.Contains(cmdline, []byte("qemu")) && bytes.Contains(cmdline, []byte(dm.dir+"/"))
}

// killQEMUOf kills pid with SIGKILL if it is a QEMU of dm's daemon, and reports whether it did.
func killQEMUOf(pid int, dm daemon) bool {
	if pid <= 0 || !isQEMUOf(pid, dm) {
		return false
	}
	return unix.Kill(pid, unix.SIGKILL) == nil
}

// readPIDFile returns the pid in a pidfile, or 0.
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

// accessAs checks, with u's file-system credentials on a thread of its own, that u can open
// path for reading (and writing when write): what QEMU will do as u.
func accessAs(u vmUser, path string, write bool) error {
	errc := make(chan error, 1)
	go func() {
		lockOSThreadForGood() // its fsuid changes; the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(u.GID), 0, 0); e != 0 {
			errc <- e
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(u.UID), 0, 0); e != 0 {
			errc <- e
			return
		}
		flags := unix.O_RDONLY
		if write {
			flags = unix.O_RDWR
		}
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			errc <- fmt.Errorf("%s cannot be opened by the VM's user %s (uid %d): %w", path, u.Name, u.UID, err)
			return
		}
		_ = unix.Close(fd)
		errc <- nil
	}()
	return <-errc
}

// libvirtVersion is the libvirt library's version ("9.0.0"), or "".
func libvirtVersion() string {
	v, err := golibvirt.GetVersion()
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
}

func itoa(n int) string { return strconv.Itoa(n) }
