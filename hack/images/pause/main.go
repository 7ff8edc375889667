// Command pause is the pod sandbox's process in the local cluster (containerd's sandbox_image):
// it holds the pod's namespaces open, reaps orphans (it is PID 1 when the pod shares its PID
// namespace) and exits 0 on SIGINT or SIGTERM. It is built static (CGO_ENABLED=0) into
// kubevisor/pause by hack/images.
//
// `pause -burn D` first spends D of CPU time on one thread (a busy loop, counted by the
// kernel's accounting of this process, not by the clock) and then pauses as usual: the
// benchmarks' stand-in for a VM that spends its boot's CPU from the moment it starts.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("kubevisor pause")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	if len(os.Args) == 3 && os.Args[1] == "-burn" {
		d, err := time.ParseDuration(os.Args[2])
		if err != nil || d < 0 {
			fmt.Fprintf(os.Stderr, "pause: -burn %q: want a duration of CPU time, e.g. 5s\n", os.Args[2])
			os.Exit(2)
		}
		go burn(d)
	}
	// Other arguments are ignored, as they always were: tests tag a pause process by its
	// command line.
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // reap every exited child
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// burn loops until the process has used d of CPU time (user and system).
func burn(d time.Duration) {
	for n := uint64(0); ; n++ {
		if n%(1<<20) == 0 && cpuTime() >= d {
			return
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
