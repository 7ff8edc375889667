package launcher

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	launcherv1 "github.com/kubevisor/kubevisor/core/launcher/v1"
)

// initPidNamespace is the inode number of the initial pid namespace (PROC_PID_INIT_INO).
const initPidNamespace = 0xEFFFFFFC

// nsInode is the inode number of a namespace file (/proc/PID/ns/KIND, /run/netns/NAME).
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return st.Ino, nil
}

// startTime is field 22 of /proc/PID/stat, as /proc (of the reader's pid namespace) shows it.
func startTime(pid int) (uint64, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	fields, err := statFields(raw)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(fields[22-3], 10, 64)
}

// parentPid is field 4 of /proc/PID/stat.
func parentPid(pid int) (int, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	fields, err := statFields(raw)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(fields[4-3])
}

// statFields are the fields of /proc/PID/stat after the command name: fields[0] is field 3.
func statFields(raw []byte) ([]string, error) {
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return nil, errors.New("malformed /proc/PID/stat")
	}
	fields := strings.Fields(string(raw[i+1:]))
	if len(fields) < 22-3+1 {
		return nil, errors.New("short /proc/PID/stat")
	}
	return fields, nil
}

// innermostPid is the last pid of the NSpid line of /proc/PID/status: the process's pid in its
// own pid namespace.
func innermostPid(pid int) (int, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			return strconv.Atoi(fields[len(fields)-1])
		}
	}
	return 0, fmt.Errorf("no NSpid in /proc/%d/status", pid)
}

// childrenOf lists the children of pid as this process's /proc shows them.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	if len(tasks) == 0 {
		return scanChildren(pid)
	}
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && t == tasks[0] {
				return scanChildren(pid) // no CONFIG_PROC_CHILDREN
			}
			continue
		}
		for f := range strings.FieldsSeq(string(raw)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// scanChildren finds the children of pid by reading every process's parent.
func scanChildren(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := parentPid(c); err == nil && pp == pid {
			out = append(out, c)
		}
	}
	return out
}

// localPid finds, among the children of parent (a pid of this namespace), the process whose
// innermost pid and start time are p's. It returns 0 if there is none.
func localPid(parent int, p *launcherv1.Process) int {
	for _, c := range childrenOf(parent) {
		if inner, err := innermostPid(c); err != nil || int64(inner) != p.GetPid() {
			continue
		}
		if st, err := startTime(c); err == nil && st == p.GetStartTime() {
			return c
		}
	}
	return 0
}

// cgroupOf is the cgroup of this process: the v2 path, else the v1 memory controller's.
func cgroupOf() string {
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	var v1 string
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			if c == "memory" {
				v1 = parts[2]
			}
		}
	}
	return v1
}

// The VM process's parent-death signal (PR_SET_PDEATHSIG) fires when the thread that forked it
// exits, not the process (prctl(2)); the Go runtime may end threads. So processes are forked from
// one goroutine locked to its thread, which never returns: the signal then comes only when the
// launcher dies.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	argv0 string
	argv  []string
	attr  *syscall.ProcAttr
	done  chan spawnResult
}

type spawnResult struct {
	pid int
	err error
}

// spawn forks and execs from the spawner thread.
func spawn(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				pid, err := syscall.ForkExec(r.argv0, r.argv, r.attr)
				r.done <- spawnResult{pid, err}
			}
		}()
	})
	done := make(chan spawnResult, 1)
	spawner.reqs <- spawnRequest{argv0, argv, attr, done}
	r := <-done
	return r.pid, r.err
}

// exitStatus describes a wait status.
func exitStatus(ws unix.WaitStatus) (code, sig int32, core bool, desc string) {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus()), 0, false, fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		desc = "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			desc += " (core dumped)"
		}
		return -1, int32(ws.Signal()), ws.CoreDump(), desc
	}
	return -1, 0, false, fmt.Sprintf("wait status %#x", uint32(ws))
}
