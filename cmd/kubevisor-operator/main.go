// Command kubevisor-operator installs, configures, upgrades and uninstalls Kubevisor from the
// cluster's Kubevisor object, with leader election, /healthz and /readyz, and Prometheus
// metrics. See package controlplane/operator.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/operator"
)

func main() {
	var cfg operator.Config
	fs := flag.NewFlagSet("kubevisor-operator", flag.ExitOnError)
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(fs)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "`path` of a kubeconfig file (default: $KUBECONFIG, the in-cluster service account, or ~/.kube/config)")
	fs.StringVar(&cfg.Version, "version", "", "image `tag` of the components when the Kubevisor names none (default: the tag of this pod's own image, found through $POD_NAMESPACE and $POD_NAME)")
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", true, "elect one leader among the replicas through a Lease; only the leader reconciles")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8080", "`address` of /metrics: HTTPS (self-signed certificate), for bearer tokens allowed get on /metrics (\"0\" turns it off)")
	fs.StringVar(&cfg.HealthProbeAddr, "health-probe-bind-address", ":8081", "`address` of /healthz and /readyz (\"0\" turns them off)")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "kubevisor-operator: no arguments are accepted")
		fs.Usage()
		os.Exit(2)
	}
	cfg.PodNamespace, cfg.PodName = os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	ctrl.SetLogger(textlogger.NewLogger(logCfg))
	if err := operator.Run(ctrl.SetupSignalHandler(), cfg); err != nil {
		fmt.Fprintf(os.Stderr, "kubevisor-operator: %v\n", err)
		os.Exit(1)
	}
}
