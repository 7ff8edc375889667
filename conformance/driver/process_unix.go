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
