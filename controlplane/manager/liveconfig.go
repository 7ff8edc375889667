package manager

import (
	"flag"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

// LiveConfig is where kubevisor-controller takes its live configuration from, and what it
// applies it to.
type LiveConfig struct {
	// Namespace and Name of the ConfigMap; empty means liveconfig's (kubevisor-system,
	// kubevisor-config).
	Namespace, Name string
	// Verbosity is the logger's -v flag (textlogger.Config.Verbosity()); nil leaves the
	// verbosity to the flag.
	Verbosity flag.Value
}

// addLiveConfig adds to mgr a watcher of the live configuration whose appliers store the
// migration settings (base with the configuration's migrations over it) into settings and set
// the verbosity; a refused version gets a Warning Event (kubevisor-controller is the component
// that reports it: the api and the handlers only log). It runs on every replica: a replica that becomes the leader has them already.
func addLiveConfig(mgr ctrl.Manager, lc *LiveConfig, base migration.Settings, settings *migration.SettingsValue) error {
	if lc == nil {
		return nil
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("client of the live configuration: %w", err)
	}
	log := mgr.GetLogger().WithName("liveconfig")
	appliers := []liveconfig.Applier{migrationApplier(base, settings, log)}
	if lc.Verbosity != nil {
		appliers = append(appliers, liveconfig.Verbosity(lc.Verbosity, liveconfig.ControllerVerbosity, log))
	}
	return mgr.Add(&liveconfig.Watcher{Client: cs, Namespace: lc.Namespace, Name: lc.Name, Appliers: appliers, Log: log,
		Recorder: mgr.GetEventRecorder("kubevisor-controller")})
}

// migrationApplier stores base with the configuration's migrations over it. The watcher
// validated the configuration; a Store that still fails (a combination Validate refuses)
// keeps the settings and says so.
func migrationApplier(base migration.Settings, settings *migration.SettingsValue, log logr.Logger) liveconfig.Applier {
	return func(c liveconfig.Config) {
		s := base.With(c.Migrations)
		if err := settings.Store(s); err != nil {
			log.Error(err, "live migration settings refused: the previous ones stay")
			return
		}
		log.Info("migration settings", "parallelMigrationsPerCluster", s.ParallelMigrationsPerCluster,
			"parallelOutboundMigrationsPerNode", s.ParallelOutboundMigrationsPerNode, "progressTimeout", s.ProgressTimeout,
			"completionTimeoutPerGiB", s.CompletionTimeoutPerGiB, "bandwidthPerMigration", s.BandwidthPerMigration.String(),
			"allowAutoConverge", s.AllowAutoConverge, "allowPostCopy", s.AllowPostCopy)
	}
}
