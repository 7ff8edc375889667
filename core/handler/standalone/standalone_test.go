package standalone

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/internal/procfs"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadVMI(t *testing.T) {
	dir := t.TempDir()
	vmi, err := LoadVMI("../testdata/demo-vmi.yaml")
	if err != nil {
		t.Fatalf("LoadVMI(demo): %v", err)
	}
	if vmi.Namespace != "default" || vmi.Name != "demo" || !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(string(vmi.UID)) {
		t.Errorf("VMI %s/%s uid %q", vmi.Namespace, vmi.Name, vmi.UID)
	}
	if other, _ := LoadVMI("../testdata/demo-vmi.yaml"); other.UID == vmi.UID {
		t.Errorf("two loads share UID %s", vmi.UID)
	}
	for _, tt := range []struct{ name, manifest, want string }{
		{"kubevirt", "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {domain: {devices: {}}}\n", "vmctl convert"},
		{"kind", "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachine\nmetadata: {name: a}\nspec: {domain: {devices: {}}}\n", `kind "VirtualMachine"`},
		{"unknown field", "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {domain: {devices: {}, gpus: []}}\n", `unknown field "spec.domain.gpus"`},
		{"wrong case", "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {domain: {devices: {}}, TerminationGracePeriodSeconds: 3}\n", "TerminationGracePeriodSeconds"},
		{"no name", "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nspec: {domain: {devices: {}}}\n", "metadata.name: required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadVMI(writeFile(t, dir, tt.name+".yaml", tt.manifest))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("LoadVMI = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := withDefaults(handler.Config{}, "/opt/kubevisor/bin")
	if !reflect.DeepEqual(c.Drivers, DefaultDrivers) || c.StateDir != DefaultStateDir || c.RunDir != DefaultRunDir {
		t.Errorf("config = %+v", c)
	}
	s := c.Standalone
	if s.Bridge != DefaultBridge || s.Subnet != DefaultSubnet || s.SandboxDir != DefaultSandboxDir ||
		s.CNIBinDir[0] != "/opt/kubevisor/_output/cni/bin" || s.BypassLauncher {
		t.Errorf("standalone = %+v", s)
	}
	if got := netnsName("7de4b396-3b4a-4288-9d36-f8d0bf39ea65"); got != "kv-7de4b3963b4a" {
		t.Errorf("netnsName = %q", got)
	}
}

// demoRun is a run of the demo VMI, as `kubevisor-handler run -f demo-vmi.yaml` does, with the
// real qmp, cni and local drivers and the launcher, on a bridge and subnet of its own.
type demoRun struct {
	t      *testing.T
	dir    string
	out    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

func startDemo(t *testing.T) *demoRun {
	t.Helper()
	return startRun(t, "../testdata/demo-vmi.yaml", nil)
}

// startRun runs the VMI in vmiFile as startDemo does, with the configuration changed by mut.
func startRun(t *testing.T, vmiFile string, mut func(*handler.Config)) *demoRun {
	t.Helper()
	root, _ := filepath.Abs("../../..")
	guest := filepath.Join(root, "_output", "guest", "disk.qcow2")
	cniBin := filepath.Join(root, "_output", "cni", "bin")
	testenv.Root(t, "network namespaces, taps, nftables")
	testenv.File(t, guest, "guest")
	for _, plugin := range []string{"bridge", "host-local"} {
		testenv.File(t, filepath.Join(cniBin, plugin), "cni-plugins")
	}
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	testenv.Command(t, "qemu-img", "qemu-utils")
	testenv.Command(t, "ip", "iproute2")
	testenv.Command(t, "nsenter", "util-linux")
	bin := buildBinaries(t)
	dir, err := os.MkdirTemp("/tmp", "kvs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bridge := "kvst-" + filepath.Base(dir)[4:]
	if len(bridge) > 15 {
		bridge = bridge[:15]
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	cfg := handler.Config{
		StateDir: filepath.Join(dir, "s"), RunDir: filepath.Join(dir, "r"),
		Images:       map[string]string{"./_output/guest/disk.qcow2": guest},
		DriverConfig: map[string]json.RawMessage{"qmp": json.RawMessage(`{"disableKVM": true}`)},
		Standalone: &handler.StandaloneConfig{
			SandboxDir: filepath.Join(dir, "sb"), CNIBinDir: []string{cniBin},
			Bridge: bridge, Subnet: "10.244.253.0/24",
		},
	}
	if mut != nil {
		mut(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &demoRun{t: t, dir: dir, out: &syncbuf.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	t.Cleanup(cancel)
	go func() {
		r.done <- Run(ctx, nil, Options{
			VMIFile: vmiFile, Config: cfg, BinDir: bin, Out: r.out,
			Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard}),
		})
	}()
	return r
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildBinaries builds the launcher and the drivers once per test binary.
func buildBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "kubevisor-standalone-test-")
		if buildErr != nil {
			return
		}
		buildErr = testbin.Build(binDir, false,
			"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher",
			"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-qmp",
			"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-cni",
			"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// waitOut waits for what on the run's output.
func (r *demoRun) waitOut(what string, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(r.out.String(), what) {
		if time.Now().After(deadline) {
			r.t.Fatalf("no %q within %s:\n%s", what, timeout, r.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// end waits for Run to return.
func (r *demoRun) end() error {
	r.t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(2 * time.Minute):
		r.t.Fatalf("Run did not end:\n%s", r.out.String())
	}
	return nil
}

// requireClean fails the test when the run left its namespace or directories.
func (r *demoRun) requireClean() {
	r.t.Helper()
	if m := regexp.MustCompile(`network namespace (kv-\w+),`).FindStringSubmatch(r.out.String()); m != nil {
		if _, err := os.Stat("/run/netns/" + m[1]); err == nil {
			r.t.Errorf("network namespace %s left", m[1])
		}
	}
	for _, d := range []string{"sb", "r", "s/vmis", "s/volumes"} {
		entries, _ := os.ReadDir(filepath.Join(r.dir, d))
		if len(entries) > 0 {
			r.t.Errorf("%s not empty: %v", d, entries)
		}
	}
	if out, _ := exec.Command("pgrep", "-f", r.dir).Output(); len(out) > 0 {
		r.t.Errorf("processes of the run left: %s", out)
	}
}

// TestRunDemo: the guest boots, prints its user-data, serves HTTP at the pod IP through
// masquerade; Ctrl-C (ctx) shuts it down gracefully and nothing is left.
func TestRunDemo(t *testing.T) {
	r := startDemo(t)
	r.waitOut("KUBEVISOR-GUEST-READY", 3*time.Minute)
	for _, want := range []string{
		"phase Scheduled", "phase Running", "Ready=True",
		"# hello from kubevisor-handler run: this line is the guest's user-data",
		"KUBEVISOR-IP: 10.0.2.2 eth0",
	} {
		if !strings.Contains(r.out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	m := regexp.MustCompile(`pod IP (\S+) on bridge`).FindStringSubmatch(r.out.String())
	if m == nil {
		t.Fatalf("no pod IP in the output:\n%s", r.out.String())
	}
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Get(fmt.Sprintf("http://%s/", m[1]))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET the guest at the pod IP %s: %v", m[1], err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(body, "kubevisor-guest ok") {
		t.Errorf("the guest at the pod IP said %q", body)
	}

	r.cancel() // Ctrl-C
	if err := r.end(); err != nil {
		t.Fatalf("Run: %v\n%s", err, r.out.String())
	}
	for _, want := range []string{"KUBEVISOR-POWEROFF", "phase Succeeded", "ended: Succeeded"} {
		if !strings.Contains(r.out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, r.out.String())
		}
	}
	r.requireClean()
}

// TestRunTPM: a VMI with a TPM, through the qmp plugin and the VMI's launcher: the guest finds
// a TPM 2.0 backed by a swtpm that runs as the launcher's child; Ctrl-C ends both.
func TestRunTPM(t *testing.T) {
	testenv.Command(t, "swtpm", "swtpm")
	r := startRun(t, "../testdata/tpm-vmi.yaml", nil)
	r.waitOut("KUBEVISOR-GUEST-READY", 3*time.Minute)
	if !regexp.MustCompile(`KUBEVISOR-TPM: tpm0 version=2 driver=tpm_crb pcr0=[0-9A-F]{64}`).MatchString(r.out.String()) {
		t.Errorf("the guest found no TPM 2.0:\n%s", r.out.String())
	}
	out, err := exec.Command("pgrep", "-f", "swtpm socket.*"+r.dir).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) != 1 {
		t.Fatalf("swtpm processes of the run: %q (%v), want one", out, err)
	}
	raw, _ := os.ReadFile("/proc/" + pids[0] + "/stat")
	launchers, _ := exec.Command("pgrep", "-f", "kubevisor-launcher.*"+r.dir).Output()
	if f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:])); len(f) < 2 || !slices.Contains(strings.Fields(string(launchers)), f[1]) {
		t.Errorf("swtpm (pid %s) has parent %v, want the run's launcher (%q)", pids[0], f, launchers)
	}
	r.cancel() // Ctrl-C
	if err := r.end(); err != nil {
		t.Fatalf("Run: %v\n%s", err, r.out.String())
	}
	r.requireClean()
}

// TestRunLauncherKilled: the launcher is killed with SIGKILL under a running guest; QEMU, its
// child, dies with it; the VMI fails with reason LauncherExited, and everything is removed.
func TestRunLauncherKilled(t *testing.T) {
	r := startDemo(t)
	r.waitOut("KUBEVISOR-GUEST-READY", 3*time.Minute)
	out, err := exec.Command("pgrep", "-f", "kubevisor-launcher --dir "+filepath.Join(r.dir, "sb")).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) != 1 {
		t.Fatalf("the launcher's pid: %q, %v", out, err)
	}
	if err := exec.Command("kill", "-KILL", pids[0]).Run(); err != nil {
		t.Fatal(err)
	}
	err = r.end()
	if err == nil || !strings.Contains(err.Error(), "ended Failed (LauncherExited)") {
		t.Errorf("Run = %v, want Failed (LauncherExited)\n%s", err, r.out.String())
	}
	for _, want := range []string{"the launcher exited without a status", "phase Failed (LauncherExited)"} {
		if !strings.Contains(r.out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, r.out.String())
		}
	}
	r.requireClean()
}

// TestRunDedicatedCPUs: the demo VMI with dedicatedCpuPlacement and isolateEmulatorThread, its
// sandbox on CPUs 0 and 1 (StandaloneConfig.CPUs): QEMU's vCPU thread runs on CPU 0 alone, its
// main thread and every other on CPU 1, as /proc says, and the guest comes up.
func TestRunDedicatedCPUs(t *testing.T) {
	mine, err := procfs.Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mine, 0) || !slices.Contains(mine, 1) {
		testenv.Missing(t, "the test runs on CPUs %v; it pins onto CPUs 0 and 1", mine)
	}
	raw, err := os.ReadFile("../testdata/demo-vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(raw), "  domain:\n", "  domain:\n    cpu: {dedicatedCpuPlacement: true, isolateEmulatorThread: true}\n", 1)
	vmiFile := filepath.Join(t.TempDir(), "dedicated-vmi.yaml")
	if err := os.WriteFile(vmiFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, vmiFile, func(c *handler.Config) { c.Standalone.CPUs = []uint32{0, 1} })
	r.waitOut("KUBEVISOR-GUEST-READY", 3*time.Minute)

	out, err := exec.Command("pgrep", "-f", "qemu-system-x86_64.*"+r.dir).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) != 1 {
		t.Fatalf("QEMU's pid: %q, %v", out, err)
	}
	pid, _ := strconv.Atoi(pids[0])
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	vcpus := 0
	for _, task := range tasks {
		comm, _ := os.ReadFile(filepath.Join(task, "comm"))
		status, err := os.ReadFile(filepath.Join(task, "status"))
		if err != nil {
			continue // the thread ended
		}
		allowed := regexp.MustCompile(`(?m)^Cpus_allowed_list:\s*(\S+)$`).FindSubmatch(status)
		if allowed == nil {
			t.Fatalf("no Cpus_allowed_list in %s/status", task)
		}
		name, want := strings.TrimSpace(string(comm)), "1" // the emulator's
		if strings.HasPrefix(name, "CPU ") {
			vcpus++
			want = "0"
		}
		t.Logf("QEMU thread %s (%q): Cpus_allowed_list %s", filepath.Base(task), name, allowed[1])
		if string(allowed[1]) != want {
			t.Errorf("QEMU thread %s (%q) may run on CPUs %s, want %s", filepath.Base(task), name, allowed[1], want)
		}
	}
	if vcpus != 1 {
		t.Errorf("QEMU has %d vCPU threads, want 1", vcpus)
	}
	r.cancel()
	if err := r.end(); err != nil {
		t.Fatalf("Run: %v\n%s", err, r.out.String())
	}
	r.requireClean()
}
