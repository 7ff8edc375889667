// Command kubevisor-launcher holds one VMI's sandbox and starts its VM process (package
// core/launcher).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/core/layout"
)

func main() {
	var cfg launcher.Config
	flag.StringVar(&cfg.Dir, "dir", "", "per-VMI directory to serve "+launcher.SocketName+" in (0700, owned by this user)")
	flag.DurationVar(&cfg.GracePeriod, "grace-period", layout.DefaultGracePeriod, "time the VM gets to stop after SIGTERM (terminationGracePeriodSeconds)")
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
