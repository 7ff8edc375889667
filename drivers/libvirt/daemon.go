package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	golibvirt "libvirt.org/go/libvirt"

	"github.com/kubevisor/kubevisor/core/driver/launcher"
)

// The per-VMI daemon's directory, <run dir>/lv. It is the daemon's whole world, so that two
// VMIs' daemons share nothing: XDG_CONFIG_HOME itself (libvirt's session-mode configuration and
// state go in lv/libvirt), with XDG_RUNTIME_DIR, XDG_CACHE_HOME and HOME below it.
//
// Its paths are short on purpose: the session daemon binds QEMU's monitor socket at
// $XDG_CONFIG_HOME/libvirt/qemu/lib/domain-<n>-<name>/monitor.sock, and a unix socket's path has
// 107 bytes at most (sun_path). The daemon runs in the VM's sandbox, which sees the run dir at
// the same path as the node (a launcher pod mounts its per-VMI directory there), so no shorter
// alias can be made on the node for it; instead the domain has a short name (DomainName: one
// domain per daemon) and Create refuses a run dir too long for the socket (maxRunDir).
const (
	daemonDir    = "lv"
	daemonSocket = "r/libvirt/libvirt-sock" // under XDG_RUNTIME_DIR = <dir>/r
	daemonLog    = "libvirtd.log"
	// DomainName is the name of every VM's domain on its own daemon; the VM's id is the
	// domain's title.
	DomainName = "vm"
	// monitorSuffix is the longest tail the daemon puts after the run dir: its directory, the
	// domain's private directory (a daemon numbers its domains from 1 and starts few) and the
	// monitor socket.
	monitorSuffix = "/" + daemonDir + "/libvirt/qemu/lib/domain-999-" + DomainName + "/monitor.sock"
	// maxRunDir is the longest run dir whose monitor socket fits in sun_path (107 bytes and a NUL).
	maxRunDir = 107 - len(monitorSuffix)
)

// daemonQEMUConf is the session daemon's qemu.conf. stdio_handler "file": QEMU's output goes
// to a file of the daemon's directory (c/qemu/log, below) rather than through a virtlogd, one
// process fewer per VMI.
const daemonQEMUConf = `stdio_handler = "file"
`

// daemon is one VMI's libvirtd: started through the VMI's launcher (or locally without one) as
// the driver's unprivileged user, in session mode (libvirt picks the mode from its euid: a
// root daemon is the system one, with the node's paths and privileges).
type daemon struct {
	dir  string // <run dir>/lv
	user vmUser
	path string // the libvirtd binary
}

// newDaemon is the daemon of the VM with run dir runDir.
func newDaemon(runDir string, u vmUser, libvirtd string) daemon {
	return daemon{dir: filepath.Join(runDir, daemonDir), user: u, path: libvirtd}
}

// vmUser is who the daemon, and so QEMU, runs as.
type vmUser struct {
	Name     string `json:"name"`
	UID, GID int
}

func (d daemon) socket() string { return filepath.Join(d.dir, daemonSocket) }
func (d daemon) uri() string    { return "qemu+unix:///session?socket=" + d.socket() }

// logPath is the daemon's own log (its stderr, through the launcher): in the run dir, not the
// daemon's, which is the user's alone: the launcher that opens it is root with SETUID and SETGID
// only (no CAP_DAC_OVERRIDE) in a launcher pod.
func (d daemon) logPath() string { return filepath.Join(filepath.Dir(d.dir), daemonLog) }

// qemuLog is where the session daemon has QEMU write (XDG_CACHE_HOME/libvirt/qemu/log).
func (d daemon) qemuLog() string {
	return filepath.Join(d.dir, "c", "libvirt", "qemu", "log", DomainName+".log")
}

// qemuPIDFile is where the session daemon keeps QEMU's pid (XDG_RUNTIME_DIR/libvirt/qemu/run).
func (d daemon) qemuPIDFile() string {
	return filepath.Join(d.dir, "r", "libvirt", "qemu", "run", DomainName+".pid")
}

// prepare makes the daemon's directories, owned by its user, and its configuration.
func (d daemon) prepare() error {
	for _, sub := range []string{"", "h", "c", "r", "libvirt"} {
		p := filepath.Join(d.dir, sub)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(d.dir, "libvirt", "qemu.conf"), []byte(daemonQEMUConf), 0o600); err != nil {
		return err
	}
	return chownTree(d.dir, d.user.UID, d.user.GID)
}

// removeRuntime removes the daemon's runtime directory (XDG_RUNTIME_DIR: its sockets and pid
// files), which a daemon that is gone leaves behind when killed.
func (d daemon) removeRuntime() {
	_ = os.RemoveAll(filepath.Join(d.dir, "r"))
}

// remove removes the daemon's directory and log.
func (d daemon) remove() {
	_ = os.RemoveAll(d.dir)
	_ = os.Remove(d.logPath())
}

// command is how the daemon is started: setpriv drops to the driver's user (the launcher runs
// as root) with empty inheritable, permitted, effective and ambient capability sets and
// no_new_privs, then libvirtd runs with its XDG directories in d.dir. No --timeout: the daemon
// lives until the driver deletes the VM. --bounding-set=-all takes CAP_SETPCAP, which a
// launcher pod lacks: setpriv then leaves the bounding set as it is and does not fail (see the
// package doc); where the launcher has it, the bounding set is emptied.
//
// launched says the daemon is started through a launcher, which starts its process with a
// parent-death signal (SIGKILL) so that the process dies with it. setpriv's --reuid clears
// that signal (a change of credentials does, prctl(2)), so setpriv sets it again once it has
// dropped to the user (util-linux 2.38's --pdeathsig), from the launcher's spawner thread,
// which never exits: the daemon then dies with the launcher, even a SIGKILLed one. Without a
// launcher there is none: the daemon outlives the driver process, and the driver's thread that
// forked it may end at any time.
func (d daemon) command(setpriv string, launched bool) *launcher.Command {
	return &launcher.Command{
		Path: setpriv,
		Args: d.asUser(launched, d.path),
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=" + filepath.Join(d.dir, "h"),
			"XDG_RUNTIME_DIR=" + filepath.Join(d.dir, "r"),
			"XDG_CONFIG_HOME=" + d.dir,
			"XDG_CACHE_HOME=" + filepath.Join(d.dir, "c"),
		},
		LogPath: d.logPath(),
	}
}

// asUser is setpriv's arguments that run argv as the VM's user with no capability and
// no_new_privs (and, through a launcher, killed when it dies).
func (d daemon) asUser(launched bool, argv ...string) []string {
	args := []string{
		"--reuid=" + strconv.Itoa(d.user.UID), "--regid=" + strconv.Itoa(d.user.GID), "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
	}
	if launched {
		args = append(args, "--pdeathsig=KILL")
	}
	return append(append(args, "--"), argv...)
}

// emulator is the domain's emulator for a daemon started through a launcher: a script in the
// daemon's directory that execs QEMU through setpriv --pdeathsig=KILL, so that QEMU dies with
// the launcher, even a SIGKILLed one, as the daemon does.
//
// libvirt daemonizes QEMU (a double fork whose middle process exits), so QEMU's parent is the
// launcher, a child subreaper, not the daemon, and nothing in libvirt 9.0 or QEMU 7.2 ends it
// when either dies. A fork clears the parent-death signal, and one set before the middle
// process exits would fire then (reparenting sends it), so only QEMU's own process can set
// it, once adopted: libvirtd lets that process exec the emulator only after it has reaped the
// middle process (their handshake), so the script runs as the launcher's child (measured with
// libvirt 9.0; libvirt's capability probe, which QEMU daemonizes itself, runs it as the
// daemon's child). The kernel gives an adopted process to the subreaper's first live thread,
// the launcher's main thread, which lives as long as the launcher (a thread's exit would send
// the signal). A launcher that dies in the few milliseconds between QEMU's adoption and
// setpriv's prctl leaves it running.
func (d daemon) emulator() string { return filepath.Join(d.dir, "qemu") }

// writeEmulator writes the emulator script (emulator) for qemu, owned by the daemon's user.
func (d daemon) writeEmulator(setpriv, qemu string) error {
	script := "#!/bin/sh\n# The VM's QEMU, killed when its launcher dies (kubevisor-driver-libvirt).\n" +
		"exec " + shellQuote(setpriv) + " --pdeathsig=KILL -- " + shellQuote(qemu) + " \"$@\"\n"
	p := d.emulator()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(script), 0o700); err != nil {
		return err
	}
	if err := os.Lchown(tmp, d.user.UID, d.user.GID); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// chownTree gives path and everything below it (not following symlinks) to uid:gid.
func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// connect opens a connection to the daemon at sock, retrying while it comes up, until timeout
// or alive reports the daemon gone.
func connect(ctx context.Context, uri string, timeout time.Duration, alive func() bool) (*golibvirt.Connect, error) {
	startEventLoop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := golibvirt.NewConnect(uri)
		if err == nil {
			// Keepalive makes a daemon that dies or hangs close the connection, which the
			// close callback reports.
			if kerr := c.SetKeepAlive(5, 3); kerr != nil {
				_, _ = c.Close()
				return nil, fmt.Errorf("keepalive: %w", kerr)
			}
			return c, nil
		}
		if alive != nil && !alive() {
			return nil, fmt.Errorf("libvirtd exited (%w)", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect %s: %w", uri, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

var eventLoop sync.Once

// startEventLoop runs libvirt's default event loop for the process, which domain events,
// keepalives and close callbacks need; it must be registered before the first connection.
func startEventLoop() {
	eventLoop.Do(func() {
		if err := golibvirt.EventRegisterDefaultImpl(); err != nil {
			panic(fmt.Sprintf("libvirt event loop: %v", err))
		}
		go func() {
			for {
				if err := golibvirt.EventRunDefaultImpl(); err != nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	})
}

// isBlockDevice says whether path is a block device (a disk given as a device, not a file).
func isBlockDevice(path string) bool {
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK
}

// giveTap makes the VM's user the owner and group of the persistent tap name in the network
// namespace netns, so that the unprivileged daemon can open it (TUNSETIFF on a tap checks its
// owner and group when the opener lacks CAP_NET_ADMIN). The network driver made the tap; only
// its owner and group change.
func giveTap(netns, name string, multiQueue bool, u vmUser) error {
	errc := make(chan error, 1)
	go func() {
		// A thread of its own, never returned to the scheduler's pool: it changes network
		// namespace.
		errc <- inNetNS(netns, func() error {
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			ifr, err := unix.NewIfreq(name)
			if err != nil {
				return err
			}
			flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
			if multiQueue {
				// A multi-queue tap takes only openers that say so (EINVAL otherwise).
				flags |= unix.IFF_MULTI_QUEUE
			}
			ifr.SetUint16(flags)
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				return fmt.Errorf("attach to tap %s: %w", name, err)
			}
			if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, u.UID); err != nil {
				return fmt.Errorf("set the owner of tap %s: %w", name, err)
			}
			// A tap with a group is the owner's only for a process in that group as well
			// (the network driver's taps have root's): the user's own.
			if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, u.GID); err != nil {
				return fmt.Errorf("set the group of tap %s: %w", name, err)
			}
			return nil
		})
	}()
	return <-errc
}

// inNetNS runs f on the calling goroutine's OS thread in the network namespace at path (none:
// here), and locks that thread out of further use: it is left in the namespace.
func inNetNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	lockOSThreadForGood()
	ns, err := os.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	return f()
}

var errNoDaemon = errors.New("the VM's libvirtd is not running")
