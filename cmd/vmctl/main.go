// Command vmctl manages Kubevisor virtual machines (package cli/vmctl/cmd). Installed as
// kubectl-vm it is the kubectl plugin "kubectl vm".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubevisor/kubevisor/cli/vmctl/cmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.Execute(ctx, os.Args[0], os.Args[1:], cmd.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
