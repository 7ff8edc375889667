package plugin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// testdriverBin is core/plugin/internal/testdriver, built once per test binary by TestMain.
var testdriverBin string

// Environment of the helper host: the test binary re-executed as a plugin host in a process of
// its own, so that a test can kill a host and keep its plugins.
const (
	envHelperHost     = "KUBEVISOR_PLUGIN_TEST_HELPER_HOST" // "detach" or "wait"
	envHelperStateDir = "KUBEVISOR_PLUGIN_TEST_STATE_DIR"
	envHelperManifest = "KUBEVISOR_PLUGIN_TEST_MANIFEST"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelperHost); mode != "" {
		os.Exit(runHelperHost(mode))
	}
	flag.Parse()
	if testbin.FuzzOnly() { // the fuzz targets need no testdriver
		os.Exit(m.Run())
	}
	// Plugins orphaned by a killed helper host are then adopted (and reaped) by this process.
	becomeSubreaper()
	dir, err := os.MkdirTemp("", "kubevisor-plugin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testdriverBin = filepath.Join(dir, "testdriver")
	if err := testbin.Build(dir, false, "github.com/kubevisor/kubevisor/core/plugin/internal/testdriver"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runHelperHost starts the plugin of the manifest in $envHelperManifest on a Host, creates VM
// "vm-1" on it, prints "ready <pid>" and then detaches and exits ("detach") or waits to be
// killed ("wait").
func runHelperHost(mode string) int {
	var m Manifest
	if err := json.Unmarshal([]byte(os.Getenv(envHelperManifest)), &m); err != nil {
		fmt.Fprintln(os.Stderr, "helper host:", err)
		return 1
	}
	h, err := NewHost(HostConfig{StateDir: os.Getenv(envHelperStateDir), NodeName: "node-1", Logger: hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Debug})})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper host:", err)
		return 1
	}
	ctx := context.Background()
	if err := h.Start(ctx, m); err != nil {
		fmt.Fprintln(os.Stderr, "helper host:", err)
		return 1
	}
	hv, err := h.Hypervisor(m.Name)
	if err == nil {
		_, err = hv.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper host:", err)
		return 1
	}
	fmt.Printf("ready %d\n", h.Status(m.Name).Pid)
	if mode == "detach" {
		if err := h.Detach(); err != nil {
			fmt.Fprintln(os.Stderr, "helper host:", err)
			return 1
		}
		return 0
	}
	select {}
}

// helperHost runs runHelperHost in a new process and returns it with the plugin's pid once the
// plugin is ready.
func helperHost(t *testing.T, mode, stateDir string, m Manifest) (*exec.Cmd, int, *syncBuffer) {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envHelperHost+"="+mode, envHelperStateDir+"="+stateDir, envHelperManifest+"="+string(data))
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper host did not get ready: %v\n%s", err, stderr.String())
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "ready "))
	if err != nil {
		t.Fatalf("helper host said %q", line)
	}
	return cmd, pid, stderr
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stateDir returns a new state directory short enough for unix socket paths (t.TempDir names
// carry the test's name).
func stateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testHost is a Host on a new state directory whose log is kept, and shown when the test fails.
type testHost struct {
	*Host
	log *syncBuffer
	dir string
}

func newTestHost(t testing.TB, cfg HostConfig) *testHost {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = stateDir(t)
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "node-1"
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	log := &syncBuffer{}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "host", Output: log, Level: hclog.Debug})
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("close host: %v", err)
		}
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})
	return &testHost{Host: h, log: log, dir: cfg.StateDir}
}

// testManifest is the manifest of the testdriver under name, with misbehaviour args.
func testManifest(t testing.TB, name string, args ...string) Manifest {
	t.Helper()
	m, err := ManifestFor(testdriverBin, driver.KindHypervisor, name)
	if err != nil {
		t.Fatal(err)
	}
	m.Args = append([]string{"name=" + name, "marker=" + markerOf(t, name)}, args...)
	return m
}

// markerOf is an argument that tells this test's plugin processes of a driver from any other.
func markerOf(t testing.TB, name string) string {
	return fmt.Sprintf("%s/%s/%d", strings.ReplaceAll(t.Name(), "/", "_"), name, os.Getpid())
}

func (h *testHost) start(t testing.TB, m Manifest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Start(ctx, m); err != nil {
		t.Fatalf("start %s: %v", m.Name, err)
	}
}

func (h *testHost) hv(t testing.TB, name string) driver.Hypervisor {
	t.Helper()
	hv, err := h.Hypervisor(name)
	if err != nil {
		t.Fatal(err)
	}
	return hv
}

// fingerprint returns the attributes of a driver's first fingerprint (fakehv reports its pid
// and what Configure received there).
func fingerprint(t testing.TB, d driver.Driver) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var attrs map[string]string
	err := d.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error {
		attrs = r.GetAttributes()
		cancel()
		return nil
	})
	if err != nil || attrs == nil {
		t.Fatalf("fingerprint: %v (attrs %v)", err, attrs)
	}
	return attrs
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countProcs counts live (not zombie) processes whose command line holds marker.
func countProcs(t testing.TB, marker string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("marker="+marker+"\x00")) {
			continue
		}
		if st, _, err := procStat(pid); err == nil && st != 'Z' && st != 'X' {
			n++
		}
	}
	return n
}

func pidAlive(pid int) bool {
	st, _, err := procStat(pid)
	return err == nil && st != 'Z' && st != 'X'
}

// wantStatus fails unless err has the code and its message holds every one of subs.
func wantStatus(t testing.TB, err error, code codes.Code, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s %q", code, subs)
	}
	if got := status.Code(err); got != code {
		t.Errorf("code %s, want %s: %v", got, code, err)
	}
	wantErr(t, err, subs...)
}

// wantErr fails unless err's message holds every one of subs.
func wantErr(t testing.TB, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one with %q", subs)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}
