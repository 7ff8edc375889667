// Package kittest runs the conformance kit's VM checks (conformance/driver/cli.RunVM) against
// the real plugin binaries of a hypervisor driver, with the local storage driver and
// kubevisor-launcher, for the tests of the drivers and of the node agent's migration proxy.
package kittest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// Options says what RunVM runs.
type Options struct {
	// Hypervisor is the driver under test: cmd/kubevisor-driver-<Hypervisor> ("qmp",
	// "libvirt").
	Hypervisor string
	// Boot is how the test guest boots: "kernel" (default) or "disk" (its containerDisk, under
	// the BIOS).
	Boot string
	// Run selects the checks (the kit's --run).
	Run string
	// Relay, when set, stands between the source and the target of every migration.
	Relay conformance.MigrationRelay
}

// Result is the kit's exit code and output.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// RunVM builds the plugin binaries and runs the kit's VM checks as `kubevisor-conformance vm`
// does, the test guest (make guest, or KUBEVISOR_GUEST_DIR) booting under the given options;
// a guest that is not built is testenv.Missing.
func RunVM(t *testing.T, o Options) Result {
	t.Helper()
	dir := GuestDir(t)
	if _, err := conformance.GuestFromDir(dir); err != nil {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	}
	bin := t.TempDir()
	hv := "kubevisor-driver-" + o.Hypervisor
	if err := testbin.Build(bin, false,
		"github.com/kubevisor/kubevisor/cmd/"+hv,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	boot := o.Boot
	if boot == "" {
		boot = "kernel"
	}
	var stdout, stderr bytes.Buffer
	code := cli.RunVM(cli.VMConfig{
		Hypervisor: filepath.Join(bin, hv),
		Storage:    filepath.Join(bin, "kubevisor-driver-local"),
		Launcher:   filepath.Join(bin, "kubevisor-launcher"),
		GuestDir:   dir,
		Boot:       boot,
		DiskBus:    "virtio", CDROMBus: "scsi",
		Run:             o.Run,
		StateDir:        filepath.Join(t.TempDir(), "state"),
		Timeout:         conformance.DefaultVMTimeout,
		BootTimeout:     conformance.DefaultBootTimeout,
		ShutdownTimeout: conformance.DefaultGuestShutdownTimeout,
		LogLevel:        "warn",
		MigrationRelay:  o.Relay,
	}, &stdout, &stderr)
	return Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

// GuestDir is the project's test guest: KUBEVISOR_GUEST_DIR, or _output/guest at the root of
// the module the test runs in.
func GuestDir(t testing.TB) string {
	if d := os.Getenv("KUBEVISOR_GUEST_DIR"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "_output", "guest")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ExpectPassed fails t unless the kit exited OK with every one of checks passed and nothing
// else run ("N passed, 0 failed, 0 skipped").
func ExpectPassed(t *testing.T, r Result, checks ...string) {
	t.Helper()
	if r.Code != cli.ExitOK {
		t.Errorf("exit code %d, want %d; stderr:\n%s", r.Code, cli.ExitOK, Tail(r.Stderr, 60))
	}
	for _, check := range checks {
		if !regexp.MustCompile(`--- PASS: vm/` + regexp.QuoteMeta(check) + ` `).MatchString(r.Stdout) {
			t.Errorf("check %s did not pass", check)
		}
	}
	if summary := fmt.Sprintf("%d passed, 0 failed, 0 skipped", len(checks)); !strings.Contains(r.Stdout, summary) {
		t.Errorf("the summary is not %s", summary)
	}
}

// ExpectTopImageCopied fails t unless the output of the kit's Migrate/LocalDisks check with the
// guest booted from its containerDisk reports that disk's top image copied.
func ExpectTopImageCopied(t *testing.T, r Result) {
	t.Helper()
	if !regexp.MustCompile(`name:"containerdisk"\s+top_only:true\s+total_bytes:\d+\s+transferred_bytes:[1-9]`).MatchString(r.Stdout) {
		t.Errorf("the check did not report the containerDisk's top image copied")
	}
}
