//go:build unix

package conformance

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// processChecks says whether processRunning can tell.
const processChecks = true

// processRunning reports whether the process pid runs: it exists and, where /proc tells, is
// not a zombie (which has exited and waits only for its parent to collect it).
func processRunning(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc, or not ours to read: it exists
	}
	// "pid (comm) S ...": the state follows the last ')', as comm may hold one.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

// descendantOf reports whether pid is ancestor or one of its descendants, by the parent pids in
// /proc.
func descendantOf(pid, ancestor int) bool {
	for i := 0; pid > 1 && i < 64; i++ {
		if pid == ancestor {
			return true
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		// "pid (comm) S ppid ...": the fields follow the last ')', as comm may hold one.
		end := bytes.LastIndexByte(stat, ')')
		if end < 0 {
			return false
		}
		fields := bytes.Fields(stat[end+1:])
		if len(fields) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(string(fields[1])); err != nil {
			return false
		}
	}
	return false
}
