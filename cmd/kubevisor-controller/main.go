// Command kubevisor-controller runs Kubevisor's controllers (VM, VMI, VMI replica set, migration, evacuation, workload update) with leader
// election, /healthz and /readyz, and Prometheus metrics. See package controlplane/manager.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/evacuation"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/controlplane/workloadupdate"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

func main() {
	var cfg manager.Config
	var pullPolicy string
	fs := flag.NewFlagSet("kubevisor-controller", flag.ExitOnError)
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(fs)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "`path` of a kubeconfig file (default: $KUBECONFIG, the in-cluster service account, or ~/.kube/config)")
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", true, "elect one leader among the replicas through a Lease; only the leader reconciles")
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", manager.DefaultLeaderElectionNamespace, "`namespace` of the leader election Lease")
	fs.StringVar(&cfg.LeaderElectionID, "leader-election-id", manager.DefaultLeaderElectionID, "`name` of the leader election Lease")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", manager.DefaultMetricsAddr, "`address` of /metrics: HTTPS (self-signed certificate), for bearer tokens allowed get on /metrics (\"0\" turns it off)")
	fs.StringVar(&cfg.HealthProbeAddr, "health-probe-bind-address", manager.DefaultHealthProbeAddr, "`address` of /healthz and /readyz (\"0\" turns them off)")
	fs.IntVar(&cfg.Workers, "workers", 4, "objects each controller reconciles at once")
	fs.StringVar(&cfg.Pod.LauncherImage, "launcher-image", "", "`image` of the launcher pods (required)")
	fs.StringVar(&pullPolicy, "launcher-image-pull-policy", string(corev1.PullIfNotPresent), "pull `policy` of the launcher image (Always, IfNotPresent, Never)")
	fs.StringVar(&cfg.Pod.HostStateDir, "host-state-dir", layout.DefaultHostStateDir, "node `directory` holding the per-VMI directories shared with launcher pods")
	fs.StringVar(&cfg.Pod.StateStorageClass, "vm-state-storage-class", "", "storage `class` of the VMs' persistent state claims (persistent TPM and EFI variables); empty: the cluster's default class")
	fs.Func("launcher-seccomp-profile", "seccomp profile `type` of the launcher pods' compute container: Localhost (default: kubevisor/launcher.json, the runtime's default plus userfaultfd for post-copy migration, which the handler DaemonSet installs on every node) or RuntimeDefault (for clusters that forbid Localhost profiles; post-copy migrations then fail)", func(s string) error {
		cfg.Pod.ComputeSeccomp = corev1.SeccompProfileType(s)
		if s != string(corev1.SeccompProfileTypeLocalhost) && s != string(corev1.SeccompProfileTypeRuntimeDefault) {
			return fmt.Errorf("want Localhost or RuntimeDefault")
		}
		return nil
	})
	mig := migration.DefaultSettings()
	cfg.Migration = &mig
	fs.BoolVar(&mig.AllowAutoConverge, "migration-allow-auto-converge", mig.AllowAutoConverge, "cluster default of MigrationPolicy allowAutoConverge: throttle a guest whose migration does not converge")
	fs.BoolVar(&mig.AllowPostCopy, "migration-allow-post-copy", mig.AllowPostCopy, "cluster default of MigrationPolicy allowPostCopy: switch a migration that does not converge to post-copy")
	fs.Int64Var(&mig.CompletionTimeoutPerGiB, "migration-completion-timeout-per-gib", mig.CompletionTimeoutPerGiB, "cluster default of MigrationPolicy completionTimeoutPerGiB: `seconds` a migration may take per GiB it copies (at least 1)")
	fs.Int64Var(&mig.ProgressTimeout, "migration-progress-timeout", mig.ProgressTimeout, "`seconds` a migration may go without progress before it is cancelled (at least 1)")
	fs.IntVar(&mig.ParallelMigrationsPerCluster, "migration-parallel-per-cluster", mig.ParallelMigrationsPerCluster, "`migrations` running at once in the cluster; more wait in Pending")
	fs.IntVar(&mig.ParallelOutboundMigrationsPerNode, "migration-parallel-outbound-per-node", mig.ParallelOutboundMigrationsPerNode, "`migrations` leaving one node at once; more wait in Pending")
	fs.Func("migration-bandwidth-per-migration", "cluster default of MigrationPolicy bandwidthPerMigration: bytes per second, a `quantity` such as 64Mi (default 0: no limit)", func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return err
		}
		mig.BandwidthPerMigration = q
		return nil
	})
	fs.Func("default-eviction-strategy", "eviction `strategy` of VMIs that set none: None (default), LiveMigrate, LiveMigrateIfPossible or External; give kubevisor-api the same", func(s string) error {
		v, err := evacuation.ParseStrategy(s)
		cfg.DefaultEvictionStrategy = v
		return err
	})
	cfg.WorkloadUpdate = workloadupdate.DefaultSettings()
	fs.Func("workload-update-methods", "how VMIs on an outdated launcher image get the current one: a comma-separated `list` of LiveMigrate (the LiveMigratable ones) and Evict (the others); empty (default): they are only marked", func(s string) error {
		m, err := workloadupdate.ParseMethods(s)
		cfg.WorkloadUpdate.Methods = m
		return err
	})
	fs.IntVar(&cfg.WorkloadUpdate.BatchSize, "workload-update-batch-size", workloadupdate.DefaultBatchSize, "`VMIs` migrated or evicted per batch (0 means 10)")
	fs.DurationVar(&cfg.WorkloadUpdate.BatchInterval, "workload-update-batch-interval", workloadupdate.DefaultBatchInterval, "`time` between two batches of the workload updater (at least 1s)")
	cfg.HandlerDaemonSet = types.NamespacedName{Namespace: "kubevisor-system", Name: "kubevisor-handler"}
	fs.Func("handler-daemonset", "`namespace/name` of the node handlers' DaemonSet (default kubevisor-system/kubevisor-handler): the workload updater acts only once its rollout is done; \"\" acts at once", func(s string) error {
		if s == "" {
			cfg.HandlerDaemonSet = types.NamespacedName{}
			return nil
		}
		ns, name, ok := strings.Cut(s, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("%q: want namespace/name", s)
		}
		cfg.HandlerDaemonSet = types.NamespacedName{Namespace: ns, Name: name}
		return nil
	})
	live := manager.LiveConfig{Verbosity: logCfg.Verbosity()}
	fs.StringVar(&live.Namespace, "live-config-namespace", liveconfig.Namespace, "`namespace` of the live configuration ConfigMap")
	fs.StringVar(&live.Name, "live-config-name", liveconfig.Name, "`name` of the live configuration ConfigMap (core/liveconfig), whose migration defaults and limits and controller log verbosity replace the flags' while it exists; \"\" turns it off")
	_ = fs.Parse(os.Args[1:])
	if live.Name != "" {
		cfg.LiveConfig = &live
	}
	cfg.Pod.ImagePullPolicy = corev1.PullPolicy(pullPolicy)
	if cfg.Pod.LauncherImage == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "kubevisor-controller: --launcher-image is required and no arguments are accepted")
		fs.Usage()
		os.Exit(2)
	}
	ctrl.SetLogger(textlogger.NewLogger(logCfg))
	if err := manager.Run(ctrl.SetupSignalHandler(), cfg); err != nil {
		fmt.Fprintf(os.Stderr, "kubevisor-controller: %v\n", err)
		os.Exit(1)
	}
}
