// Package manager builds and runs kubevisor-controller: one controller-runtime manager with
// leader election, health probes, metrics, and every Kubevisor controller.
package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/kubevisor/kubevisor/controlplane/evacuation"
	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/controlplane/metrics"
	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/controlplane/vm"
	"github.com/kubevisor/kubevisor/controlplane/vmi"
	"github.com/kubevisor/kubevisor/controlplane/vmirs"
	"github.com/kubevisor/kubevisor/controlplane/workloadupdate"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/metricsauth"
)

// Defaults of Config, which kubevisor-controller's flags start from.
const (
	DefaultLeaderElectionNamespace = "kubevisor-system"
	DefaultLeaderElectionID        = "kubevisor-controller"
	DefaultMetricsAddr             = ":8080"
	DefaultHealthProbeAddr         = ":8081"
)

// cacheSyncTimeout bounds how long one /readyz request waits for the cache.
const cacheSyncTimeout = time.Second

// Config is what kubevisor-controller runs with.
type Config struct {
	// RestConfig reaches the API server. Nil loads one: from Kubeconfig when set, else $KUBECONFIG,
	// the in-cluster service account, or ~/.kube/config (client-side rate limiting off, leaving
	// it to the API server's priority and fairness, as controller-runtime does).
	RestConfig *rest.Config
	// Kubeconfig is the path of a kubeconfig file, used when RestConfig is nil.
	Kubeconfig string

	// LeaderElection makes replicas elect one leader through a Lease; only the leader reconciles.
	LeaderElection bool
	// LeaderElectionNamespace and LeaderElectionID name the Lease. Empty means the defaults above.
	LeaderElectionNamespace string
	LeaderElectionID        string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election; zero keeps
	// controller-runtime's defaults (15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// MetricsAddr is where /metrics is served, over HTTPS to requests whose bearer token the API
	// server authenticates and authorizes for get on /metrics (core/metricsauth); "0" turns it
	// off. Its certificate is self-signed, made at start.
	MetricsAddr string
	// HealthProbeAddr is where /healthz and /readyz are served (plain HTTP, for the kubelet);
	// "0" turns them off.
	HealthProbeAddr string

	// Pod shapes the launcher pods the VMI controller builds.
	Pod launcherpod.Config
	// Workers is how many objects each controller reconciles at once; 0 means 1.
	Workers int
	// Migration is the cluster's default migration settings, over which MigrationPolicies apply;
	// nil means migration.DefaultSettings(). With LiveConfig, the live configuration's
	// migrations replace its fields while the manager runs (and it applies again when they
	// are gone).
	Migration *migration.Settings
	// MigrationSettings is what the controllers read the migration settings from; nil: New
	// makes one. New stores Migration into it; a caller that passes one sees the live
	// configuration's changes in it.
	MigrationSettings *migration.SettingsValue
	// LiveConfig, when set, makes every replica watch the live configuration
	// (core/liveconfig) and take its migration defaults and limits and its controller log
	// verbosity without a restart.
	LiveConfig *LiveConfig

	// DefaultEvictionStrategy is the eviction strategy of VMIs that set none ("" is None); the
	// evacuation controller keeps PodDisruptionBudgets by it. kubevisor-api's eviction webhook
	// must be given the same (its --default-eviction-strategy).
	DefaultEvictionStrategy v1alpha1.EvictionStrategy

	// WorkloadUpdate is the workload updater's strategy for VMIs whose launcher pod runs another
	// image than Pod.LauncherImage; the zero value marks them only, with the default batch.
	WorkloadUpdate workloadupdate.Settings
	// HandlerDaemonSet is the node handlers' DaemonSet, whose rollout holds the workload
	// updater's batches (workloadupdate.Options); zero: no hold.
	HandlerDaemonSet types.NamespacedName

	// SkipNameValidation lets several managers run in one process (tests, benchmarks).
	SkipNameValidation bool
}

// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=kubevisor-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Scheme returns the types kubevisor-controller reads and writes.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// New builds the manager with every controller, the metrics, and the health checks; Start runs it.
func New(cfg Config) (ctrl.Manager, error) {
	base := migration.DefaultSettings()
	if cfg.Migration != nil {
		base = *cfg.Migration
	}
	if err := base.Validate(); err != nil {
		return nil, fmt.Errorf("migration defaults: %w", err)
	}
	migrationSettings := cfg.MigrationSettings
	if migrationSettings == nil {
		migrationSettings = &migration.SettingsValue{}
	}
	if err := migrationSettings.Store(base); err != nil {
		return nil, fmt.Errorf("migration defaults: %w", err)
	}
	if err := cfg.WorkloadUpdate.Validate(); err != nil {
		return nil, err
	}
	restCfg, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	// Launcher pods are the only pods the controllers read: caching only those keeps the
	// controller's memory independent of the cluster's other pods.
	launcherPods, err := labels.NewRequirement(v1alpha1.CreatedByLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	opts := ctrl.Options{
		Scheme: Scheme(),
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*launcherPods)},
			// Likewise the evacuation controller's PodDisruptionBudgets, which carry the label too.
			&policyv1.PodDisruptionBudget{}: {Label: labels.NewSelector().Add(*launcherPods)},
		}},
		Metrics:                    metricsauth.Options(or(cfg.MetricsAddr, DefaultMetricsAddr), ""),
		HealthProbeBindAddress:     or(cfg.HealthProbeAddr, DefaultHealthProbeAddr),
		LeaderElection:             cfg.LeaderElection,
		LeaderElectionID:           or(cfg.LeaderElectionID, DefaultLeaderElectionID),
		LeaderElectionNamespace:    or(cfg.LeaderElectionNamespace, DefaultLeaderElectionNamespace),
		LeaderElectionResourceLock: "leases",
		// Run returns, and the process exits, right after the context ends: stepping down at once
		// lets the next replica lead without waiting out the lease.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 nonZero(cfg.LeaseDuration),
		RenewDeadline:                 nonZero(cfg.RenewDeadline),
		RetryPeriod:                   nonZero(cfg.RetryPeriod),
	}
	if cfg.SkipNameValidation {
		opts.Controller = config.Controller{SkipNameValidation: &cfg.SkipNameValidation}
	}
	mgr, err := ctrl.NewManager(restCfg, opts)
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add readyz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("cache-sync", cacheSynced(mgr)); err != nil {
		return nil, fmt.Errorf("add readyz check: %w", err)
	}

	w, skip := cfg.Workers, cfg.SkipNameValidation
	setups := []struct {
		name  string
		setup func() error
	}{
		{"vm", func() error {
			return vm.SetupWithManager(mgr, vm.Options{MaxConcurrentReconciles: w, SkipNameValidation: skip})
		}},
		{"vmi", func() error {
			return vmi.SetupWithManager(mgr, vmi.Options{Pod: cfg.Pod, MaxConcurrentReconciles: w, SkipNameValidation: skip})
		}},
		{"vmirs", func() error {
			return vmirs.SetupWithManager(mgr, vmirs.Options{MaxConcurrentReconciles: w, SkipNameValidation: skip})
		}},
		{"migration", func() error {
			return migration.SetupWithManager(mgr, migration.Options{MaxConcurrentReconciles: w, SkipNameValidation: skip, Settings: migrationSettings,
				LauncherImage: cfg.Pod.LauncherImage})
		}},
		{"evacuation", func() error {
			return evacuation.SetupWithManager(mgr, evacuation.Options{DefaultStrategy: cfg.DefaultEvictionStrategy,
				Migration: migrationSettings, MaxConcurrentReconciles: w, SkipNameValidation: skip})
		}},
		{"workload-update", func() error {
			return workloadupdate.SetupWithManager(mgr, workloadupdate.Options{LauncherImage: cfg.Pod.LauncherImage,
				Settings: cfg.WorkloadUpdate, HandlerDaemonSet: cfg.HandlerDaemonSet, SkipNameValidation: skip})
		}},
		{"metrics", func() error { return metrics.SetupWithManager(mgr) }},
		{"live configuration", func() error { return addLiveConfig(mgr, cfg.LiveConfig, base, migrationSettings) }},
	}
	for _, s := range setups {
		if err := s.setup(); err != nil {
			return nil, fmt.Errorf("set up %s: %w", s.name, err)
		}
	}
	return mgr, nil
}

// Run builds the manager and runs it until ctx ends. With leader election, the caller must exit
// once Run returns: controllers may otherwise still act after the lease is lost.
func Run(ctx context.Context, cfg Config) error {
	mgr, err := New(cfg)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

func restConfig(cfg Config) (*rest.Config, error) {
	if cfg.RestConfig != nil {
		return rest.CopyConfig(cfg.RestConfig), nil
	}
	if cfg.Kubeconfig == "" {
		c, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	if c.QPS == 0 {
		c.QPS = -1
	}
	return c, nil
}

// cacheSynced is ready once the manager's cache has started and every informer in it synced.
func cacheSynced(mgr ctrl.Manager) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), cacheSyncTimeout)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("cache not synced")
		}
		return nil
	}
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}
