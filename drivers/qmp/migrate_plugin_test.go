package qmp

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestMigrationConformancePlugins runs the kit's Migrate checks against the real plugin
// binaries, as `kubevisor-conformance vm --run Migrate` does: two kubevisor-driver-qmp
// processes, each started by a plugin host of its own with its own state directory (two
// "nodes" on this host), every VM under a kubevisor-launcher of its own, the test guest booting
// its kernel under TCG and moving from one to the other over a unix socket. The checks' log
// lines (timings, progress samples) are in the test's output with -v.
// runKit runs the conformance VM kit's checks matching run against the real plugin binaries
// (kubevisor-driver-qmp, kubevisor-driver-local, kubevisor-launcher), the test guest booting
// from boot ("kernel" or "disk"), and returns its exit code, stdout and stderr.
func runKit(t *testing.T, boot, run string) (int, string, string) {
	t.Helper()
	requireQEMU(t)
	dir := guestDir()
	if _, err := conformance.GuestFromDir(dir); err != nil {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	}
	bin := t.TempDir()
	if err := testbin.Build(bin, false,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-qmp",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := cli.RunVM(cli.VMConfig{
		Hypervisor: filepath.Join(bin, "kubevisor-driver-qmp"),
		Storage:    filepath.Join(bin, "kubevisor-driver-local"),
		Launcher:   filepath.Join(bin, "kubevisor-launcher"),
		GuestDir:   dir,
		Boot:       boot,
		DiskBus:    "virtio", CDROMBus: "scsi",
		Run:             run,
		StateDir:        filepath.Join(t.TempDir(), "state"),
		Timeout:         conformance.DefaultVMTimeout,
		BootTimeout:     conformance.DefaultBootTimeout,
		ShutdownTimeout: conformance.DefaultGuestShutdownTimeout,
		LogLevel:        "warn",
	}, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestMigrationConformancePlugins(t *testing.T) {
	code, out, stderrOut := runKit(t, "kernel", "Migrate")
	t.Logf("kubevisor-conformance vm --run Migrate:\n%s", out)
	if code != cli.ExitOK {
		t.Errorf("exit code %d, want %d; stderr:\n%s", code, cli.ExitOK, tailLines(stderrOut, 60))
	}
	for _, check := range []string{"Migrate/KeepsGuestState", "Migrate/Progress", "Migrate/Cancel", "Migrate/LocalDisks", "Migrate/LocalDisksCancel"} {
		if !regexp.MustCompile(`--- PASS: vm/` + check + ` `).MatchString(out) {
			t.Errorf("check %s did not pass", check)
		}
	}
	if !strings.Contains(out, "5 passed, 0 failed, 0 skipped") {
		t.Errorf("the summary is not 5 passed, 0 failed, 0 skipped")
	}
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestMigrationLocalDisksDiskBoot runs the kit's Migrate/LocalDisks check as
// TestMigrationConformancePlugins does, with the guest booting from its containerDisk under the
// BIOS: the VM then has the containerDisk's overlay as well as the emptyDisk, and the check
// copies the overlay's top image only (sync top: the target's fresh overlay is over the same
// base) and the emptyDisk whole, and reads a marker from each back on the target.
func TestMigrationLocalDisksDiskBoot(t *testing.T) {
	code, out, stderrOut := runKit(t, "disk", "Migrate/LocalDisks$")
	t.Logf("kubevisor-conformance vm --boot disk --run Migrate/LocalDisks:\n%s", out)
	if code != cli.ExitOK {
		t.Errorf("exit code %d, want %d; stderr:\n%s", code, cli.ExitOK, tailLines(stderrOut, 60))
	}
	if !regexp.MustCompile(`--- PASS: vm/Migrate/LocalDisks `).MatchString(out) || !strings.Contains(out, "1 passed, 0 failed, 0 skipped") {
		t.Errorf("Migrate/LocalDisks did not pass")
	}
	if !regexp.MustCompile(`name:"containerdisk"\s+top_only:true\s+total_bytes:\d+\s+transferred_bytes:[1-9]`).MatchString(out) {
		t.Errorf("the check did not report the containerDisk's top image copied")
	}
}
