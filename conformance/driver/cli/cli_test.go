package cli_test

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]string{} // command name → binary
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// build builds the command cmd/<name>, once for all tests, and returns the binary.
func build(t *testing.T, name string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not on PATH to build %s: %v", name, err)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[name]; ok {
		return bin
	}
	if buildDir == "" {
		if buildDir, err = os.MkdirTemp("", "kvc-cli-test-"); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(buildDir, name)
	if out, err := exec.Command(goTool, "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/"+name).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	built[name] = bin
	return bin
}

// buildFake builds cmd/kubevisor-driver-fake and returns the binary.
func buildFake(t *testing.T) string { return build(t, "kubevisor-driver-fake") }

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(args, &out, &errOut)
	t.Logf("kubevisor-conformance %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// TestDriverAgainstFakePlugin runs the CLI against the fake driver plugin of every kind.
func TestDriverAgainstFakePlugin(t *testing.T) {
	bin := buildFake(t)
	for _, kind := range []string{"hypervisor", "network", "storage", "device"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			junit := filepath.Join(dir, "junit.xml")
			args := []string{"driver", "--plugin", bin, "--kind", kind, "--arg", kind,
				"--junit", junit, "--state-dir", filepath.Join(dir, "state")}
			switch kind {
			case "hypervisor":
				args = append(args, "--console-marker", fake.ConsoleMarker)
			case "device":
				config := filepath.Join(dir, "config.json")
				if err := os.WriteFile(config, []byte(`{"unhealthy": ["kvm-0"]}`), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", config)
			}
			code, stdout, _ := run(t, args...)
			if code != cli.ExitOK {
				t.Fatalf("exit code %d, want 0", code)
			}

			b, err := os.ReadFile(junit)
			if err != nil {
				t.Fatal(err)
			}
			var rep conformance.JUnitReport
			if err := xml.Unmarshal(b, &rep); err != nil {
				t.Fatalf("parse the JUnit report: %v\n%s", err, b)
			}
			if len(rep.Suites) != 1 || rep.Suites[0].Name != kind {
				t.Fatalf("JUnit suites %+v, want one named %s", rep.Suites, kind)
			}
			s := rep.Suites[0]
			if s.Failures != 0 || s.Tests < 10 || s.Tests != len(s.Cases) {
				t.Errorf("JUnit suite: tests=%d failures=%d cases=%d", s.Tests, s.Failures, len(s.Cases))
			}
			names := map[string]bool{}
			for _, c := range s.Cases {
				names[c.Name] = true
			}
			for _, want := range []string{"Info/NameAndKind", "Configure/Idempotent"} {
				if !names[want] {
					t.Errorf("JUnit report lacks check %s", want)
				}
			}
			if kind == "hypervisor" {
				for _, want := range []string{"Lifecycle/CreateStartStatusShutdownDelete", "Console/Output", "Recover/Running"} {
					c := findCase(s.Cases, want)
					if c == nil || c.Skipped != nil || c.Failure != nil {
						t.Errorf("hypervisor check %s did not pass: %+v", want, c)
					}
				}
			}

			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			summary := fmt.Sprintf("%d passed, %d failed, %d skipped", s.Tests-s.Failures-s.Skipped, s.Failures, s.Skipped)
			if last := lines[len(lines)-1]; last != summary {
				t.Errorf("last line %q, want %q", last, summary)
			}
			if !strings.Contains(stdout, "--- PASS: "+kind+"/Info/NameAndKind (") {
				t.Errorf("stdout lacks the progress line of Info/NameAndKind")
			}
		})
	}
}

func findCase(cases []conformance.JUnitCase, name string) *conformance.JUnitCase {
	for i := range cases {
		if cases[i].Name == name {
			return &cases[i]
		}
	}
	return nil
}

func TestDriverRunFilter(t *testing.T) {
	bin := buildFake(t)
	code, stdout, _ := run(t, "driver", "--plugin", bin, "--kind", "network", "--arg", "network", "--run", "Setup/StableMAC|Teardown")
	if code != cli.ExitOK {
		t.Fatalf("exit code %d, want 0", code)
	}
	if !strings.HasSuffix(strings.TrimSpace(stdout), "\n1 passed, 0 failed, 0 skipped") || !strings.Contains(stdout, "--- PASS: network/Setup/StableMAC (") {
		t.Errorf("stdout does not show exactly Setup/StableMAC passing:\n%s", stdout)
	}
}

func TestDriverFailures(t *testing.T) {
	bin := buildFake(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		// The plugin serves another kind than asked: the host refuses it.
		{"WrongKind", []string{"--plugin", bin, "--kind", "network", "--arg", "storage"}, "--- FAIL: network ("},
		{"NoBinary", []string{"--plugin", filepath.Join(t.TempDir(), "missing"), "--kind", "device"}, "--- FAIL: device ("},
		// The fake refuses an unknown configuration field when the host configures it.
		{"BadConfig", []string{"--plugin", bin, "--kind", "storage", "--arg", "storage", "--config", writeFile(t, `{"noSuchKnob": 1}`)}, "noSuchKnob"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, _ := run(t, append([]string{"driver", "--state-dir", t.TempDir()}, c.args...)...)
			if code != cli.ExitFail {
				t.Errorf("exit code %d, want %d", code, cli.ExitFail)
			}
			if !strings.Contains(stdout, c.want) || !strings.HasSuffix(strings.TrimSpace(stdout), "0 passed, 1 failed, 0 skipped") {
				t.Errorf("stdout does not report the failure %q:\n%s", c.want, stdout)
			}
		})
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"cluster"},
		{"driver"},
		{"driver", "--plugin", "x"},
		{"driver", "--plugin", "x", "--kind", "printer"},
		{"driver", "--plugin", "x", "--kind", "device", "--run", "a/("},
		{"driver", "--plugin", "x", "--kind", "device", "extra"},
		{"driver", "--no-such-flag"},
	} {
		if code, _, stderr := run(t, args...); code != cli.ExitUsage || stderr == "" {
			t.Errorf("%q: exit code %d with stderr %q, want %d and a message", args, code, stderr, cli.ExitUsage)
		}
	}
}
