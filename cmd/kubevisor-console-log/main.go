// Command kubevisor-console-log follows a VMI's serial console log to stdout until SIGTERM: the
// launcher pod's guest-console-log container (package core/launcher/consolelog). Standard
// library only (besides core/layout's names), built static into the launcher image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kubevisor/kubevisor/core/launcher/consolelog"
	"github.com/kubevisor/kubevisor/core/layout"
)

func main() {
	file := flag.String("file", "", "console log `file` to follow (the VMI directory's "+layout.ConsoleLogName+")")
	poll := flag.Duration("poll", 500*time.Millisecond, "how often to look for new output")
	flag.Parse()
	if *file == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kubevisor-console-log --file FILE [--poll D]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := consolelog.Follow(ctx, *file, os.Stdout, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-console-log:", err)
		os.Exit(1)
	}
}
