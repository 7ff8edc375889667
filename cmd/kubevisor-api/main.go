// Command kubevisor-api serves Kubevisor's admission webhooks (package controlplane/webhook):
// defaulting and validation of VirtualMachines, VirtualMachineInstances, replica sets and
// migrations, and the evictions of launcher pods (kubectl drain: a VMI with evictionStrategy
// LiveMigrate is migrated instead), over TLS with a self-managed, rotated certificate, with
// /healthz and /readyz; and, in the same process, the aggregated API server
// subresources.kubevisor.io (package controlplane/subresources) with the same serving
// certificate.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/subresources"
	"github.com/kubevisor/kubevisor/controlplane/webhook"
)

func main() {
	cfg := webhook.DefaultConfig()
	cfg.AddFlags(flag.CommandLine)
	sub := subresources.DefaultConfig()
	sub.AddFlags(flag.CommandLine)
	// klog's text logger rather than zap: it is already a dependency of client-go.
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kubevisor-api: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctrl.SetLogger(textlogger.NewLogger(logCfg))
	// The subresource server shares the webhook's certificate directory.
	sub.CertDir = cfg.CertDir

	if err := run(cfg, sub); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-api:", err)
		os.Exit(1)
	}
}

func run(cfg webhook.Config, sub subresources.Config) error {
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	mgr, err := webhook.NewManager(restCfg, cfg)
	if err != nil {
		return err
	}
	if err := subresources.AddToManager(mgr, sub); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
