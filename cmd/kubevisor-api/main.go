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

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/subresources"
	"github.com/kubevisor/kubevisor/controlplane/webhook"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

func main() {
	cfg := webhook.DefaultConfig()
	cfg.AddFlags(flag.CommandLine)
	sub := subresources.DefaultConfig()
	sub.AddFlags(flag.CommandLine)
	// klog's text logger rather than zap: it is already a dependency of client-go.
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(flag.CommandLine)
	live := liveconfig.Watcher{}
	flag.StringVar(&live.Namespace, "live-config-namespace", liveconfig.Namespace, "`namespace` of the live configuration ConfigMap")
	flag.StringVar(&live.Name, "live-config-name", liveconfig.Name, "`name` of the live configuration ConfigMap (core/liveconfig), whose api log verbosity replaces -v and whose featureGates replace --feature-gates while it exists; \"\" turns it off")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kubevisor-api: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctrl.SetLogger(textlogger.NewLogger(logCfg))
	// The subresource server shares the webhook's certificate directory.
	sub.CertDir = cfg.CertDir

	// Admission reads the feature gates from this holder at each request: --feature-gates until
	// the live configuration's featureGates replace them, without a restart.
	cfg.LiveFeatureGates = featuregate.NewLive(cfg.FeatureGates)
	var w *liveconfig.Watcher
	if live.Name != "" {
		log := ctrl.Log.WithName("liveconfig")
		live.Log = log
		live.Appliers = []liveconfig.Applier{
			liveconfig.Verbosity(logCfg.Verbosity(), liveconfig.APIVerbosity, log),
			liveconfig.FeatureGates(cfg.LiveFeatureGates, cfg.FeatureGates, log),
		}
		w = &live
	}
	if err := run(cfg, sub, w); err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-api:", err)
		os.Exit(1)
	}
}

// run serves until a signal; live, when not nil, is added to the manager with a client of its
// own (it reads one ConfigMap, past the manager's cache).
func run(cfg webhook.Config, sub subresources.Config, live *liveconfig.Watcher) error {
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
	if live != nil {
		if live.Client, err = kubernetes.NewForConfig(restCfg); err != nil {
			return err
		}
		if err := mgr.Add(live); err != nil {
			return err
		}
		// Not ready (no admission, no subresources through the Service) until the live
		// configuration is read: admission's feature gates come from it, and the flags alone
		// would refuse what the Kubevisor allows for the moment after a start.
		if err := mgr.AddReadyzCheck("live-config", live.Ready); err != nil {
			return err
		}
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
