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

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/drivers/hostdev"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

// hostdevSource returns the hostdev driver configured with config, behind the plugin boundary
// (in-process gRPC: the host's client, Watch through Optional), as a Source.
func hostdevSource(t *testing.T, config []byte) Source {
	t.Helper()
	d := hostdev.New(hclog.New(&hclog.LoggerOptions{Name: "hostdev", Level: hclog.Debug, Output: testWriter{t}}))
	client, stop, err := driver.InProcess(basev1.Kind_KIND_DEVICE, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if err := client.Configure(t.Context(), &basev1.ConfigureRequest{Config: config}); err != nil {
		t.Fatalf("configure hostdev: %v", err)
	}
	return Source{Name: hostdev.Name, Device: client.(driver.Device)}
}

// testConfig is the plugins' configuration on a plugin directory with the given poll interval.
func testConfig(pluginDir string, poll time.Duration) Config {
	return Config{PluginDir: pluginDir, HealthPollInterval: metav1.Duration{Duration: poll}}
}

// newManager builds a manager of the hostdev driver on host h: the four character devices with
// 4 slots each, NVIDIA 10de:1eb8 as pci-10de-1eb8, hostdev polling every driverPoll.
func newManager(t *testing.T, h *hostdevtest.Host, dir, driverPoll string, pci ...string) *Manager {
	t.Helper()
	if pci == nil {
		pci = []string{"10de:1eb8=pci-10de-1eb8"}
	}
	m, err := NewManager(t.Context(), testConfig(dir, time.Hour), []Source{hostdevSource(t, h.Config(t, driverPoll, 4, pci...))}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: testWriter{t}})
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

// runManager runs m until the test ends.
func runManager(t *testing.T, m *Manager) *Manager {
	t.Helper()
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

// kvmOnly is the hostdev driver offering only kvm (2 slots) on a fake host.
func kvmOnly(t *testing.T) driver.Device {
	h := hostdevtest.New(t)
	return hostdevSource(t, []byte(fmt.Sprintf(`{"devRoot": %q, "charDevices": [{"resourceName": "kvm", "path": "/dev/kvm", "slots": 2}]}`, h.DevRoot))).Device
}
