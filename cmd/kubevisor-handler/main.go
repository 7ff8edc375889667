// Command kubevisor-handler is Kubevisor's node agent (package core/handler). Without a
// cluster it runs one VMI from a manifest (package core/handler/standalone):
//
//	kubevisor-handler run -f vmi.yaml [--config handler.yaml]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/standalone"
)

const usage = `usage: kubevisor-handler run -f VMI.yaml [--config HANDLER.yaml] [--log-level LEVEL]

Runs one VirtualMachineInstance on this machine without a cluster: a network namespace on the
host bridge kv-standalone0 with a kubevisor-launcher in it, the VMI booted through the
configured driver plugins (default qmp, cni, local: the kubevisor-driver-* binaries next to
this one), its phase changes and serial console on stdout. Ctrl-C or SIGTERM shuts the guest
down within terminationGracePeriodSeconds and removes everything; a second Ctrl-C cuts the
shutdown short. Needs root.
`

func main() {
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	vmiFile := fs.String("f", "", "VMI manifest (kubevisor.io/v1alpha1 VirtualMachineInstance)")
	configFile := fs.String("config", "", "handler configuration file (YAML or JSON)")
	logLevel := fs.String("log-level", "warn", "log level: trace, debug, info, warn, error")
	_ = fs.Parse(os.Args[2:])
	if *vmiFile == "" || fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	var cfg handler.Config
	if *configFile != "" {
		var err error
		if cfg, err = handler.LoadConfig(*configFile); err != nil {
			fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
			os.Exit(2)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
		os.Exit(1)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-handler", Level: hclog.LevelFromString(*logLevel), Output: os.Stderr})

	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		cancel()
		<-signals
		close(stop)
	}()
	err = standalone.Run(ctx, stop, standalone.Options{
		VMIFile: *vmiFile, Config: cfg, BinDir: filepath.Dir(exe), Out: os.Stdout, Logger: logger,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
		os.Exit(1)
	}
}
