// Command pause is the pod sandbox's process in the local cluster (containerd's sandbox_image):
// it holds the pod's namespaces open, reaps orphans (it is PID 1 when the pod shares its PID
// namespace) and exits 0 on SIGINT or SIGTERM. It is built static (CGO_ENABLED=0) into
// kubevisor/pause by hack/images.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("kubevisor pause")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
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
