package launcher

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

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
