// Command kubevisor-containerdisk is the command of a launcher pod's containerDisk containers:
// it serves a unix socket (--socket) until SIGTERM, so that the node handler finds the container
// and, through it, the image's disk (package core/handler/cluster/containerdisk). With --copy-to
// it copies itself into a directory and exits: the launcher pod's init container
// install-containerdisk, from the launcher image, puts it so in an emptyDir that the
// containerDisk containers run it from. It is a static binary with no dependency beyond the standard library and core/layout.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubevisor/kubevisor/core/handler/cluster/containerdisk"
	"github.com/kubevisor/kubevisor/core/layout"
)

func main() {
	socket := flag.String("socket", "", "unix socket `path` to serve until SIGTERM")
	copyTo := flag.String("copy-to", "", "copy this binary into `dir` and exit")
	flag.Parse()
	switch {
	case *copyTo != "":
		if err := containerdisk.CopySelf(*copyTo); err != nil {
			fail("copy to %s: %v", *copyTo, err)
		}
	case *socket != "":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		s, err := containerdisk.Listen(*socket)
		if err != nil {
			fail("%v", err)
		}
		<-sigs
		if err := s.Close(); err != nil {
			fail("%v", err)
		}
	default:
		fail("--socket or --copy-to is required")
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, layout.ContainerDiskCommand+": "+format+"\n", args...)
	os.Exit(1)
}
