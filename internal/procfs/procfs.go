// Package procfs reads what the launcher and its clients need to know about processes from
// /proc: namespace inodes, start times, parents and children, and pids across pid namespaces.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// InitPidNamespace is the inode number of the initial pid namespace (PROC_PID_INIT_INO).
const InitPidNamespace = 0xEFFFFFFC

// NSInode is the inode number of a namespace file (/proc/PID/ns/KIND, /run/netns/NAME).
func NSInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return st.Ino, nil
}

// StartTime is field 22 of /proc/PID/stat (clock ticks after boot), as /proc of the reader's
// pid namespace shows it: with a pid it names a process against pid reuse.
func StartTime(pid int) (uint64, error) {
	fields, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(fields[22-3], 10, 64)
}

// ParentPid is field 4 of /proc/PID/stat.
func ParentPid(pid int) (int, error) {
	fields, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(fields[4-3])
}

func stat(pid int) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	return StatFields(raw)
}

// StatFields are the fields of /proc/PID/stat after the command name: fields[0] is field 3.
// The command name may hold spaces and parentheses.
func StatFields(raw []byte) ([]string, error) {
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

// InnermostPid is the last pid of the NSpid line of /proc/PID/status: the process's pid in its
// own pid namespace.
func InnermostPid(pid int) (int, error) {
	return nspid(filepath.Join("/proc", strconv.Itoa(pid), "status"))
}

// Children lists the children of pid as this process's /proc shows them.
func Children(pid int) []int {
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
		if pp, err := ParentPid(c); err == nil && pp == pid {
			out = append(out, c)
		}
	}
	return out
}

// ChildByInnerPid finds, among the children of parent (a pid of this namespace), the process
// whose innermost pid is inner and whose start time is startTime. It returns 0 if there is none.
func ChildByInnerPid(parent int, inner int64, startTime uint64) int {
	for _, c := range Children(parent) {
		if in, err := InnermostPid(c); err != nil || int64(in) != inner {
			continue
		}
		if st, err := StartTime(c); err == nil && st == startTime {
			return c
		}
	}
	return 0
}

// Cgroup is the cgroup of this process: the v2 path, else the v1 memory controller's.
func Cgroup() string {
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

// Affinity is the CPUs thread (or process) tid of this pid namespace may run on
// (sched_getaffinity(2)), in increasing order. The kernel keeps a task's affinity within its
// cpuset cgroup and sets it to the cpuset's CPUs when the task enters the cgroup or the cpuset
// changes, so a task no one narrowed has its cgroup's cpuset.cpus.effective (under cgroup v1,
// cpuset.effective_cpus).
func Affinity(tid int) ([]uint32, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity %d: %w", tid, err)
	}
	var cpus []uint32
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, uint32(c))
		}
	}
	return cpus, nil
}

// Threads maps the threads of process pid (a pid of this namespace), by their ids in the
// process's own pid namespace (the innermost of each thread's NSpid, what the process itself
// calls them, as QEMU's query-cpus-fast thread-id), to their ids in this namespace. A thread
// that ends while it is read is left out.
func Threads(pid int) (map[int]int, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int, len(entries))
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		inner, err := nspid(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue
		}
		out[inner] = tid
	}
	return out, nil
}

// nspid is the last pid of the NSpid line of a status file.
func nspid(path string) (int, error) {
	f, err := os.Open(path)
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
	return 0, fmt.Errorf("no NSpid in %s", path)
}
