package network

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// errNSGone is returned by inNS when the namespace's path does not exist (or is not a
// namespace any more).
var errNSGone = errors.New("network namespace is gone")

// nsID identifies a network namespace (the nsfs inode), so that a namespace deleted and made
// again at the same path is told apart.
type nsID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func (id nsID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// statNS returns the identity of the network namespace at path, errNSGone when there is none.
func statNS(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return nsID{}, fmt.Errorf("%s: %w", path, errNSGone)
		}
		return nsID{}, fmt.Errorf("stat network namespace %s: %w", path, err)
	}
	var fst unix.Statfs_t
	if err := unix.Statfs(path, &fst); err == nil && fst.Type != unix.NSFS_MAGIC && fst.Type != unix.PROC_SUPER_MAGIC {
		// A bind mount of a namespace is on nsfs; a plain file left after `ip netns del` is not.
		return nsID{}, fmt.Errorf("%s is not a network namespace: %w", path, errNSGone)
	}
	return nsID{Dev: st.Dev, Ino: st.Ino}, nil
}

// inNS runs fn on an OS thread that has entered the network namespace at path, and returns
// fn's error. Sockets fn opens stay in the namespace after it returns; links it makes are
// made there. The thread goes back to the Go scheduler only once it is back in the namespace
// it came from; when it cannot get back, the goroutine ends locked to it, and the runtime ends
// the thread: no other goroutine ever runs in the namespace by accident.
func inNS(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", path, errNSGone)
		}
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
	return onThread(func() error {
		if err := netns.Set(target); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("%s is not a network namespace: %w", path, errNSGone)
			}
			return fmt.Errorf("enter network namespace %s: %w", path, err)
		}
		return fn()
	})
}

// inNewNS runs fn on an OS thread in a new, empty network namespace, which goes away after
// fn returns (nothing else holds it).
func inNewNS(fn func() error) error {
	return onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare a network namespace: %w", err)
		}
		return fn()
	})
}

// onThread runs fn, which may move its thread to another network namespace, on a locked
// thread of a goroutine of its own, and moves the thread back afterwards (see inNS).
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// writeSysctl writes value to /proc/sys/<key> ("net/ipv4/ip_forward") in the calling thread's
// network namespace, and returns the previous value.
func writeSysctl(key, value string) (string, error) {
	// /proc/sys/net resolves in the network namespace of the calling thread.
	path := "/proc/sys/" + key
	prev, err := readSysctl(key)
	if err != nil {
		return "", err
	}
	if prev == value {
		return prev, nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return prev, fmt.Errorf("write %s=%s: %w", key, value, err)
	}
	return prev, nil
}

// readSysctl reads /proc/sys/<key> in the calling thread's network namespace.
func readSysctl(key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + key)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}
