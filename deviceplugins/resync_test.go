package deviceplugins

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

const devicesNIC = v1alpha1.DeviceResourcePrefix + "nic"

// TestResyncFollowsResources: after the hostdev driver takes other permitted host devices,
// Resync retires the plugin of the resource removed (its ListAndWatch sends an empty list and
// ends, its socket goes) and registers one for the resource added; the other plugins are left
// alone (no new registration, their streams go on). Back again, the removed resource gets a
// new plugin on the same socket name.
func TestResyncFollowsResources(t *testing.T) {
	h := hostdevtest.New(t)
	dir := pluginDir(t)
	k := startFakeKubelet(t, dir)
	src := hostdevSource(t, h.Config(t, "1h", 2, "10de:1eb8=gpu"))
	m, err := NewManager(t.Context(), testConfig(dir, time.Hour), []Source{src}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, m)
	regs := k.registrations(t, 5, 10*time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gpuStream, err := k.client(t, regs[devicesGPU].Endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := gpuStream.Recv(); err != nil || len(r.Devices) != 2 {
		t.Fatalf("gpu first list %v, %v", r, err)
	}
	kvmStream, err := k.client(t, regs[v1alpha1.KVMDeviceResource].Endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := kvmStream.Recv(); err != nil || len(r.Devices) != 2 {
		t.Fatalf("kvm first list %v, %v", r, err)
	}
	kvmNext := make(chan *pluginapi.ListAndWatchResponse, 1)
	go func() {
		if r, err := kvmStream.Recv(); err == nil {
			kvmNext <- r
		}
	}()
	gpuSocket := filepath.Join(dir, regs[devicesGPU].Endpoint)
	kvmPlugin := pluginOf(t, m, v1alpha1.KVMDeviceResource)

	// gpu out, nic in.
	if err := src.Device.Configure(t.Context(), &basev1.ConfigureRequest{Config: h.Config(t, "1h", 2, "8086:1572=nic")}); err != nil {
		t.Fatal(err)
	}
	added, removed, err := m.Resync(t.Context())
	if err != nil || !slices.Equal(added, []string{devicesNIC}) || !slices.Equal(removed, []string{devicesGPU}) {
		t.Fatalf("Resync = %v, %v, %v; want nic added, gpu removed", added, removed, err)
	}
	// The kubelet's gpu stream: maybe the driver's own news first (its devices Unhealthy),
	// then an empty list, then the end.
	for {
		r, err := gpuStream.Recv()
		if err != nil {
			t.Fatalf("gpu stream ended (%v) without an empty list", err)
		}
		if len(r.Devices) == 0 {
			break
		}
		if !slices.Equal(allHealth(r.Devices), []string{pluginapi.Unhealthy}) {
			t.Fatalf("gpu stream after removal: %v", r.Devices)
		}
	}
	if _, err := gpuStream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("gpu stream after the empty list: %v, want its end", err)
	}
	if _, err := os.Stat(gpuSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retired plugin's socket: %v, want it gone", err)
	}
	nic := k.registrations(t, 1, 10*time.Second)[devicesNIC]
	if nic == nil {
		t.Fatal("nic did not register")
	}
	if devs := watchList(t, ctx, k, nic.Endpoint, devicesNIC)(); len(devs) != 1 || devs[0].ID != "0000:04:00.0" || devs[0].Health != pluginapi.Healthy {
		t.Errorf("nic list %v, want 0000:04:00.0 healthy", devs)
	}
	if got := resources(m); !slices.Equal(got, []string{v1alpha1.KVMDeviceResource, devicesNIC, v1alpha1.SEVDeviceResource, v1alpha1.TunDeviceResource, v1alpha1.VhostNetDeviceResource}) {
		t.Errorf("plugins %v", got)
	}
	if pluginOf(t, m, v1alpha1.KVMDeviceResource) != kvmPlugin || kvmPlugin.Registrations() != 1 {
		t.Errorf("the kvm plugin was replaced or registered again (%d registrations)", kvmPlugin.Registrations())
	}
	select {
	case r := <-kvmNext:
		t.Errorf("kvm stream sent %v on a change that keeps kvm", r.Devices)
	case <-time.After(300 * time.Millisecond):
	}

	// Nothing changed: nothing happens.
	if added, removed, err := m.Resync(t.Context()); len(added)+len(removed) != 0 || err != nil {
		t.Errorf("Resync without a change: %v, %v, %v", added, removed, err)
	}

	// And back.
	if err := src.Device.Configure(t.Context(), &basev1.ConfigureRequest{Config: h.Config(t, "1h", 2, "10de:1eb8=gpu")}); err != nil {
		t.Fatal(err)
	}
	if added, removed, err := m.Resync(t.Context()); err != nil || !slices.Equal(added, []string{devicesGPU}) || !slices.Equal(removed, []string{devicesNIC}) {
		t.Fatalf("Resync back = %v, %v, %v", added, removed, err)
	}
	gpu := k.registrations(t, 1, 10*time.Second)[devicesGPU]
	if gpu == nil || filepath.Join(dir, gpu.Endpoint) != gpuSocket {
		t.Fatalf("gpu registration %v, want one on %s", gpu, gpuSocket)
	}
	if devs := watchList(t, ctx, k, gpu.Endpoint, devicesGPU)(); len(devs) != 2 {
		t.Errorf("gpu list after it came back: %v", devs)
	}
}

// TestResyncConflict: a resource another driver declares too stays with the driver that has
// it, and the error names both; the rest of the change is made.
func TestResyncConflict(t *testing.T) {
	h := hostdevtest.New(t)
	sim := fake.NewDevice()
	if err := sim.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(`{"count": 1, "resources": ["example-sim"]}`)}); err != nil {
		t.Fatal(err)
	}
	src := hostdevSource(t, h.Config(t, "1h", 1, "10de:1eb8=gpu"))
	m, err := NewManager(t.Context(), testConfig(pluginDir(t), time.Hour), []Source{src, {Name: "sim", Device: sim}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Device.Configure(t.Context(), &basev1.ConfigureRequest{Config: h.Config(t, "1h", 1, "8086:1572=example-sim")}); err != nil {
		t.Fatal(err)
	}
	added, removed, err := m.Resync(t.Context())
	if err == nil || err.Error() != `resource "example-sim": declared by device drivers "hostdev" and "sim"` {
		t.Errorf("Resync error %v, want the conflict named", err)
	}
	if len(added) != 0 || !slices.Equal(removed, []string{devicesGPU}) {
		t.Errorf("Resync = %v, %v; want gpu removed, nothing added", added, removed)
	}
	if p := pluginOf(t, m, "devices.kubevisor.io/example-sim"); p.src.Name != "sim" {
		t.Errorf("example-sim is served by %s, want sim still", p.src.Name)
	}
}

func pluginOf(t *testing.T, m *Manager, resource string) *Plugin {
	t.Helper()
	for _, p := range m.Plugins() {
		if p.ResourceName() == resource {
			return p
		}
	}
	t.Fatalf("no plugin of %s", resource)
	return nil
}

func resources(m *Manager) []string {
	var out []string
	for _, p := range m.Plugins() {
		out = append(out, p.ResourceName())
	}
	slices.Sort(out)
	return out
}
