package manager_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestLiveConfig runs kubevisor-controller's manager with the live configuration on and
// changes the ConfigMap while it runs: the migration settings the controllers read and the
// verbosity follow, over the flags' (Config.Migration, -v), and return to them when the
// ConfigMap is deleted; the manager is never restarted.
func TestLiveConfig(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: liveconfig.Namespace}}); err != nil {
		t.Fatal(err)
	}
	base := migration.DefaultSettings()
	base.ParallelMigrationsPerCluster = 4
	settings := &migration.SettingsValue{}
	logCfg := textlogger.NewConfig(textlogger.Verbosity(1))
	// Read through a LockedValue: klog's String is not atomic against the watcher's Set.
	verbosity := &liveconfig.LockedValue{Value: logCfg.Verbosity()}
	mgr, err := manager.New(manager.Config{
		RestConfig: env.Config, MetricsAddr: "0", HealthProbeAddr: "0", SkipNameValidation: true,
		Pod:       launcherpod.Config{LauncherImage: "kubevisor-launcher:test"},
		Migration: &base, MigrationSettings: settings,
		LiveConfig: &manager.LiveConfig{Verbosity: verbosity},
	})
	if err != nil {
		t.Fatal(err)
	}
	envtest.RunManager(t, mgr)
	if got := settings.Load().ParallelMigrationsPerCluster; got != 4 {
		t.Fatalf("before any ConfigMap: parallelMigrationsPerCluster %d, want the flag's 4", got)
	}

	c := liveconfig.New()
	per, v := int32(9), int32(6)
	c.Migrations = &v1alpha1.KubevisorMigrations{ParallelMigrationsPerCluster: &per}
	c.LogVerbosity = &liveconfig.LogVerbosity{Controller: &v}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: liveconfig.Namespace, Name: liveconfig.Name}, Data: data}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "parallelMigrationsPerCluster 9 and verbosity 6", func() (bool, error) {
		return settings.Load().ParallelMigrationsPerCluster == 9 && verbosity.String() == "6", nil
	})
	if s := settings.Load(); s.ParallelOutboundMigrationsPerNode != migration.DefaultParallelOutboundMigrationsPerNode {
		t.Errorf("settings %+v: the fields the ConfigMap leaves out keep the flags'", s)
	}

	// A bad version: refused with a Warning Event naming the field, the settings kept.
	cm.Data = map[string]string{liveconfig.Key: "apiVersion: " + liveconfig.APIVersion + "\nkind: " + liveconfig.Kind + "\nmigrations:\n  parallelMigrationsPerCluster: 0\n"}
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Warning Event on the ConfigMap", func() (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(liveconfig.Namespace)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == liveconfig.ReasonRefused && e.Type == corev1.EventTypeWarning && e.Regarding.Name == liveconfig.Name &&
				strings.Contains(e.Note, "migrations.parallelMigrationsPerCluster") {
				return true, nil
			}
		}
		return false, nil
	})
	if got := settings.Load().ParallelMigrationsPerCluster; got != 9 {
		t.Errorf("after a bad version: parallelMigrationsPerCluster %d, want the last good 9", got)
	}

	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the flags' settings again", func() (bool, error) {
		return settings.Load().ParallelMigrationsPerCluster == 4 && verbosity.String() == "1", nil
	})
}
