// Command kubevisor-api serves Kubevisor's admission webhooks (package controlplane/webhook):
// defaulting and validation of VirtualMachines, VirtualMachineInstances, replica sets and
// migrations, over TLS with a self-managed, rotated certificate, with /healthz and /readyz.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/webhook"
)

func main() {
	cfg := webhook.DefaultConfig()
	cfg.AddFlags(flag.CommandLine)
	// klog's text logger rather than zap: it is already a dependency of client-go.
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kubevisor-api: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctrl.SetLogger(textlogger.NewLogger(logCfg))

	restCfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-api:", err)
		os.Exit(1)
	}
	if err := webhook.Run(ctrl.SetupSignalHandler(), restCfg, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-api:", err)
		os.Exit(1)
	}
}
