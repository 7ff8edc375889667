package deviceplugins

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeHost is a /dev and /sys tree in a temporary directory.
type fakeHost struct {
	devRoot, sysRoot string
}

// The fake host's PCI functions: two NVIDIA functions bound to vfio-pci in groups 12 and 13,
// one with the same ID bound to another driver, one with no driver, and an Intel function
// bound to vfio-pci in group 15.
var fakePCI = []struct {
	addr, vendor, device, driver, group, numa string
}{
	{"0000:01:00.0", "0x10de", "0x1eb8", "vfio-pci", "12", "0"},
	{"0000:02:00.0", "0x10de", "0x1eb8", "vfio-pci", "13", "-1"},
	{"0000:03:00.0", "0x10de", "0x1eb8", "nvidia", "14", "0"},
	{"0000:05:00.0", "0x10DE", "0x1EB8", "", "16", "0"},
	{"0000:04:00.0", "0x8086", "0x1572", "vfio-pci", "15", "1"},
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	h := &fakeHost{devRoot: filepath.Join(root, "host"), sysRoot: filepath.Join(root, "sys")}
	for _, p := range []string{"/dev/kvm", "/dev/net/tun", "/dev/vhost-net", "/dev/sev", "/dev/vfio/vfio", "/dev/vfio/12", "/dev/vfio/13", "/dev/vfio/14", "/dev/vfio/15"} {
		h.touch(t, p)
	}
	for _, d := range fakePCI {
		h.addPCI(t, d.addr, d.vendor, d.device, d.driver, d.group, d.numa)
	}
	return h
}

// addPCI adds a PCI function the way sysfs shows it: the real directory under devices/,
// linked from bus/pci/devices, with driver and iommu_group links.
func (h *fakeHost) addPCI(t *testing.T, addr, vendor, device, driver, group, numa string) {
	t.Helper()
	real := filepath.Join(h.sysRoot, "devices", "pci0000:00", addr)
	mustMkdir(t, real)
	mustWrite(t, filepath.Join(real, "vendor"), vendor+"\n")
	mustWrite(t, filepath.Join(real, "device"), device+"\n")
	mustWrite(t, filepath.Join(real, "numa_node"), numa+"\n")
	if driver != "" {
		mustSymlink(t, "../../../bus/pci/drivers/"+driver, filepath.Join(real, "driver"))
	}
	mustSymlink(t, "../../../kernel/iommu_groups/"+group, filepath.Join(real, "iommu_group"))
	mustMkdir(t, filepath.Join(h.sysRoot, "bus", "pci", "devices"))
	mustSymlink(t, "../../../devices/pci0000:00/"+addr, filepath.Join(h.sysRoot, "bus", "pci", "devices", addr))
}

func (h *fakeHost) touch(t *testing.T, devPath string) {
	t.Helper()
	p := filepath.Join(h.devRoot, devPath)
	mustMkdir(t, filepath.Dir(p))
	mustWrite(t, p, "")
}

func (h *fakeHost) remove(t *testing.T, devPath string) {
	t.Helper()
	if err := os.Remove(filepath.Join(h.devRoot, devPath)); err != nil {
		t.Fatal(err)
	}
}

// rebind points a PCI function's driver link elsewhere, as unbinding and binding do.
func (h *fakeHost) rebind(t *testing.T, addr, driver string) {
	t.Helper()
	link := filepath.Join(h.sysRoot, "devices", "pci0000:00", addr, "driver")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	mustSymlink(t, "../../../bus/pci/drivers/"+driver, link)
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// testConfig is the fake host's configuration: the four character devices with 4 slots and
// the NVIDIA ID under its default resource name.
func (h *fakeHost) config(pluginDir string, poll time.Duration) Config {
	cfg := DefaultConfig()
	for i := range cfg.CharDevices {
		cfg.CharDevices[i].Slots = 4
	}
	cfg.PluginDir = pluginDir
	cfg.DevRoot = h.devRoot
	cfg.SysfsRoot = h.sysRoot
	cfg.HealthPollInterval = metav1.Duration{Duration: poll}
	cfg.PCIDevices = []PCISelector{{Vendor: "10de", Device: "1eb8"}}
	return cfg
}

// fakeKubelet is the kubelet's side of the device plugin API: a Registration server on
// kubelet.sock that, like the kubelet, dials the plugin back before answering.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer

	dir  string
	srv  *grpc.Server
	reqs chan *pluginapi.RegisterRequest

	mu      sync.Mutex
	clients []*grpc.ClientConn
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, reqs: make(chan *pluginapi.RegisterRequest, 16)}
	ln, err := net.Listen("unix", filepath.Join(dir, KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.stop)
	return k
}

// Register implements pluginapi.RegistrationServer.
func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	c, err := k.dial(r.Endpoint)
	if err != nil {
		return nil, err
	}
	if _, err := pluginapi.NewDevicePluginClient(c).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		return nil, fmt.Errorf("dial plugin back: %w", err)
	}
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

// dial connects to a plugin's endpoint the way the kubelet does: relative to its directory.
func (k *fakeKubelet) dial(endpoint string) (*grpc.ClientConn, error) {
	c, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.clients = append(k.clients, c)
	k.mu.Unlock()
	return c, nil
}

func (k *fakeKubelet) client(t *testing.T, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	c, err := k.dial(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return pluginapi.NewDevicePluginClient(c)
}

// stop stops serving (which unlinks kubelet.sock) and drops the connections to plugins.
func (k *fakeKubelet) stop() {
	k.srv.Stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.clients {
		c.Close()
	}
	k.clients = nil
}

// registrations collects n registration requests, failing after timeout.
func (k *fakeKubelet) registrations(t *testing.T, n int, timeout time.Duration) map[string]*pluginapi.RegisterRequest {
	t.Helper()
	got := map[string]*pluginapi.RegisterRequest{}
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case r := <-k.reqs:
			if _, dup := got[r.ResourceName]; dup {
				t.Errorf("%s registered twice", r.ResourceName)
			}
			got[r.ResourceName] = r
		case <-deadline:
			t.Fatalf("%d of %d registrations after %v: %v", len(got), n, timeout, keys(got))
		}
	}
	return got
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// runManager runs a manager for cfg until the test ends.
func runManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	m, err := NewManager(cfg, hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: testWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return m
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

// pluginDir returns a directory for sockets: short, since a unix socket path is limited to 108
// bytes and t.TempDir() paths can be long.
func pluginDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kvdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
