package manager_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/controlplane/workloadupdate"
)

// TestNewRefusesBadMigrationDefaults checks that the manager does not start with cluster
// migration defaults a MigrationPolicy could not hold, naming the field.
func TestNewRefusesBadMigrationDefaults(t *testing.T) {
	bad := migration.DefaultSettings()
	bad.CompletionTimeoutPerGiB = 0
	_, err := manager.New(manager.Config{RestConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Migration: &bad})
	if err == nil || !strings.Contains(err.Error(), "completionTimeoutPerGiB") {
		t.Errorf("New = %v, want the migration defaults refused naming completionTimeoutPerGiB", err)
	}
}

// TestNewRefusesBadWorkloadUpdate checks that the manager does not start with a workload
// update batch interval under 1s.
func TestNewRefusesBadWorkloadUpdate(t *testing.T) {
	bad := workloadupdate.DefaultSettings()
	bad.BatchInterval = time.Millisecond
	_, err := manager.New(manager.Config{RestConfig: &rest.Config{Host: "https://127.0.0.1:1"}, WorkloadUpdate: bad})
	if err == nil || !strings.Contains(err.Error(), "batch interval") {
		t.Errorf("New = %v, want the workload update interval refused", err)
	}
}
