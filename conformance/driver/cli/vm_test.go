package cli_test

import (
	"encoding/xml"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// guestDir returns the directory of the project's test guest ($KUBEVISOR_GUEST_DIR or
// <repo>/_output/guest), skipping the test when it is not built (failing it under CI=true).
func guestDir(t *testing.T) string {
	t.Helper()
	testenv.Heavy(t, "QEMU and the test guest")
	dir := os.Getenv("KUBEVISOR_GUEST_DIR")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(wd, "..", "..", "..", "_output", "guest") // conformance/driver/cli
	}
	if _, err := conformance.GuestFromDir(dir); errors.Is(err, fs.ErrNotExist) {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestVMAgainstRealPlugins runs `vm` against the QEMU and the local storage driver plugins,
// with the checks that do not need cloud-init (see knownFailures in conformance/driver): the
// Recover check kills the QEMU driver's plugin process with SIGKILL.
func TestVMAgainstRealPlugins(t *testing.T) {
	dir := guestDir(t)
	hv, st := build(t, "kubevisor-driver-qmp"), build(t, "kubevisor-driver-local")
	out := t.TempDir()
	junit := filepath.Join(out, "junit.xml")
	code, stdout, _ := run(t, "vm", "--hypervisor", hv, "--storage", st, "--guest-dir", dir, "--launcher", build(t, "kubevisor-launcher"),
		"--junit", junit, "--state-dir", filepath.Join(out, "state"), "--run", "Boot|Kill|Recover|Storage")
	if code != cli.ExitOK {
		t.Errorf("exit code %d, want 0", code)
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var rep conformance.JUnitReport
	if err := xml.Unmarshal(b, &rep); err != nil {
		t.Fatalf("parse the JUnit report: %v\n%s", err, b)
	}
	if len(rep.Suites) != 1 || rep.Suites[0].Name != "vm" {
		t.Fatalf("JUnit suites %+v, want one named vm", rep.Suites)
	}
	cases := rep.Suites[0].Cases
	for _, want := range []string{"Boot/ConsoleMarker", "Kill", "Recover/AfterDriverKilled", "Storage/NotAnImage"} {
		c := findCase(cases, want)
		if c == nil || c.Skipped != nil || c.Failure != nil {
			t.Errorf("check %s did not pass: %+v", want, c)
		}
	}
	if len(cases) != 4 {
		t.Errorf("%d checks ran, want 4", len(cases))
	}
	for _, want := range []string{"=== hypervisor qmp: ", "=== storage local: ", "=== guest: kernel ", "=== launcher: ", "4 passed, 0 failed, 0 skipped"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
}

func TestVMNoGuest(t *testing.T) {
	bin := buildFake(t)
	code, stdout, _ := run(t, "vm", "--hypervisor", bin, "--storage", bin, "--guest-dir", t.TempDir(), "--state-dir", t.TempDir())
	if code != cli.ExitFail {
		t.Errorf("exit code %d, want %d", code, cli.ExitFail)
	}
	if !strings.Contains(stdout, "--- FAIL: vm (") || !strings.Contains(stdout, "make guest") || !strings.HasSuffix(strings.TrimSpace(stdout), "0 passed, 1 failed, 0 skipped") {
		t.Errorf("stdout does not report the missing guest:\n%s", stdout)
	}
}

func TestVMSameName(t *testing.T) {
	bin := buildFake(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, conformance.GuestDiskFile), []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := run(t, "vm", "--hypervisor", bin, "--storage", bin, "--guest-dir", dir, "--state-dir", t.TempDir())
	if code != cli.ExitFail || !strings.Contains(stdout, "--storage-name") {
		t.Errorf("exit code %d, want %d and a failure saying to name a driver:\n%s", code, cli.ExitFail, stdout)
	}
}

func TestVMUsage(t *testing.T) {
	base := []string{"vm", "--hypervisor", "h", "--storage", "s", "--guest-dir", "g"}
	for _, args := range [][]string{
		{"vm"},
		{"vm", "--storage", "s", "--guest-dir", "g"},
		{"vm", "--hypervisor", "h", "--guest-dir", "g"},
		{"vm", "--hypervisor", "h", "--storage", "s"},
		append(base, "--boot", "pxe"),
		append(base, "--disk-bus", "ide"),
		append(base, "--cdrom-bus", "virtio"),
		append(base, "--run", "a/("),
		append(base, "--skip", "a/("),
		append(base, "--log-level", "loud"),
		append(base, "extra"),
		{"driver", "--plugin", "p", "--kind", "storage", "--guest-dir", "g"},
		{"driver", "--plugin", "p", "--kind", "hypervisor", "--guest-dir", "g", "--domain", "d"},
		{"vm", "--no-such-flag"},
	} {
		if code, _, stderr := run(t, args...); code != cli.ExitUsage || stderr == "" {
			t.Errorf("%q: exit code %d with stderr %q, want %d and a message", args, code, stderr, cli.ExitUsage)
		}
	}
	if code, _, stderr := run(t, "vm", "-h"); code != cli.ExitOK || !strings.Contains(stderr, "--guest-dir") {
		t.Errorf("vm -h: exit code %d, stderr %q: want 0 and the flags", code, stderr)
	}
}

// TestDriverGuestDir: `driver --guest-dir` boots the test guest in the hypervisor checks' VMs,
// so that Console/Output sees its ready marker, the default --console-marker then.
func TestDriverGuestDir(t *testing.T) {
	dir := guestDir(t)
	hv := build(t, "kubevisor-driver-qmp")
	code, stdout, _ := run(t, "driver", "--plugin", hv, "--kind", "hypervisor", "--guest-dir", dir,
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--run", "Console/Output")
	if code != cli.ExitOK || !strings.Contains(stdout, "1 passed, 0 failed, 0 skipped") {
		t.Errorf("exit code %d, want 0 and Console/Output passing:\n%s", code, stdout)
	}
}

// TestDriverDomainFile: `driver --domain` takes the VMs' domain spec from a file; one the
// driver cannot honour makes the checks that create VMs fail with its message.
func TestDriverDomainFile(t *testing.T) {
	bin := buildFake(t)
	domain := filepath.Join(t.TempDir(), "domain.json")
	if err := os.WriteFile(domain, []byte(`{"memory": {"guestBytes": "1048576"}, "machine": {"type": "q35"}, "serial": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := run(t, "driver", "--plugin", bin, "--kind", "hypervisor", "--arg", "hypervisor", "--domain", domain,
		"--console-marker", fake.ConsoleMarker, "--state-dir", filepath.Join(t.TempDir(), "state"), "--run", "Lifecycle|Console")
	if code != cli.ExitOK || !strings.Contains(stdout, "5 passed, 0 failed, 0 skipped") {
		t.Errorf("exit code %d, want 0 with Lifecycle and Console passing:\n%s", code, stdout)
	}
	if err := os.WriteFile(domain, []byte(`{"memory": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ = run(t, "driver", "--plugin", bin, "--kind", "hypervisor", "--arg", "hypervisor", "--domain", domain,
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--run", "Lifecycle")
	if code != cli.ExitFail || !strings.Contains(stdout, "memory") {
		t.Errorf("exit code %d, want 1 with the spec's problem:\n%s", code, stdout)
	}
}
