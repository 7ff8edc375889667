package hostdev_test

import (
	"bytes"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/drivers/hostdev"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

// conformanceHost is a fake host with an unhealthy device of each kind (no /dev/sev; a GPU
// whose group node is gone), so that the kit's Allocate/Unhealthy check runs.
func conformanceHost(t *testing.T) []byte {
	h := hostdevtest.New(t)
	h.Remove(t, "/dev/sev")
	h.Remove(t, "/dev/vfio/13")
	return h.Config(t, "1h", 3, "10de:1eb8=gpu", "8086:1572=nic")
}

// TestConformance runs the device conformance kit against the driver across the plugin
// boundary (in-process gRPC), on a fake host.
func TestConformance(t *testing.T) {
	conformance.DeviceTesting(t, hostdev.New(nil), conformance.WithName(hostdev.Name), conformance.WithConfig(conformanceHost(t)))
}

// TestConformancePlugin runs kubevisor-conformance driver against the kubevisor-driver-hostdev
// binary started by the plugin host, as `make demo` does, and reads its JUnit report.
func TestConformancePlugin(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubevisor-driver-hostdev")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-hostdev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	config := filepath.Join(dir, "config.json")
	if err := os.WriteFile(config, conformanceHost(t), 0o600); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(dir, "junit.xml")
	var out, errOut bytes.Buffer
	code := cli.Run([]string{"driver", "--plugin", bin, "--kind", "device", "--config", config,
		"--junit", junit, "--state-dir", filepath.Join(dir, "state")}, &out, &errOut)
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	if code != cli.ExitOK {
		t.Fatalf("kubevisor-conformance driver: exit %d", code)
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var rep conformance.JUnitReport
	if err := xml.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, s := range rep.Suites {
		if s.Failures != 0 {
			t.Errorf("suite %s: %d failures", s.Name, s.Failures)
		}
		for _, c := range s.Cases {
			ran[c.Name] = c.Skipped == nil
		}
	}
	for _, name := range []string{"List", "Allocate/Known", "Allocate/Unknown", "Allocate/Unhealthy", "Watch/SendsAtOnce", "Capabilities/Stable"} {
		if !ran[name] {
			t.Errorf("check %s did not run (cases: %v)", name, ran)
		}
	}
}
