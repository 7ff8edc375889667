package testbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	if err := Build(dir, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "kubevisor-driver-fake")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("binary not built: %v", err)
	}
	err := Build(dir, false, "github.com/kubevisor/kubevisor/cmd/no-such-command")
	if err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Fatalf("Build of a missing package = %v, want an error naming it", err)
	}
}
