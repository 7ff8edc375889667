// Command kubevisor-launcher holds one VMI's sandbox and starts its VM process (package
// core/launcher). As `kubevisor-launcher console-log --file FILE` it follows the guest's
// serial console log to stdout (the launcher pod's guest-console-log container).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kubevisor/kubevisor/core/launcher"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "console-log" {
		consoleLog(os.Args[2:])
		return
	}
	var cfg launcher.Config
	flag.StringVar(&cfg.Dir, "dir", "", "per-VMI directory to serve "+launcher.SocketName+" in (0700, owned by this user)")
	flag.DurationVar(&cfg.GracePeriod, "grace-period", launcher.DefaultGracePeriod, "time the VM gets to stop after SIGTERM (terminationGracePeriodSeconds)")
	flag.DurationVar(&cfg.KillMargin, "kill-margin", 0, "how long before the end of the grace period the VM process is killed (default: a fifth of it, at most 5s)")
	flag.StringVar(&cfg.VMI, "vmi", "", "name of the VMI, for logs and the status file")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kubevisor-launcher: unexpected arguments %q\n", flag.Args())
		os.Exit(launcher.ExitStartFailed)
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	os.Exit(launcher.Run(cfg))
}

// consoleLog follows the console log file to stdout until SIGTERM.
func consoleLog(args []string) {
	fs := flag.NewFlagSet("console-log", flag.ExitOnError)
	file := fs.String("file", "", "console log `file` to follow (the VMI directory's "+launcher.ConsoleLogName+")")
	poll := fs.Duration("poll", 500*time.Millisecond, "how often to look for new output")
	_ = fs.Parse(args)
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kubevisor-launcher console-log --file FILE")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := launcher.FollowFile(ctx, *file, os.Stdout, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-launcher console-log:", err)
		os.Exit(1)
	}
}
