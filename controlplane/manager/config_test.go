package manager_test

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/controlplane/migration"
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
