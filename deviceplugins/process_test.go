package deviceplugins

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

// startHostdevProcess builds kubevisor-driver-hostdev, starts it through the plugin host
// (StartDrivers, as kubevisor-deviceplugins does) on a fake host with slots kvm slots and the
// PCI function 10de:1eb8 as resource gpu, and runs the plugins' Manager against a fake
// kubelet. The host is closed when the test ends.
func startHostdevProcess(t *testing.T, slots int) (*plugin.Host, *Manager, *fakeKubelet, plugin.Manifest) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubevisor-driver-hostdev")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-hostdev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	m, err := plugin.ManifestFor(bin, "device", "hostdev")
	if err != nil {
		t.Fatal(err)
	}
	m.Config = hostdevtest.New(t).Config(t, "1h", slots, "10de:1eb8=gpu")
	host, sources, err := StartDrivers(t.Context(), plugin.HostConfig{StateDir: filepath.Join(dir, "state"), Logger: testLogger(t), MinBackoff: 50 * time.Millisecond}, []plugin.Manifest{m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	pdir := pluginDir(t)
	k := startFakeKubelet(t, pdir)
	mgr, err := NewManager(t.Context(), testConfig(pdir, time.Hour), sources, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)
	return host, mgr, k, m
}

// TestDriverPluginProcess runs the plugins on kubevisor-driver-hostdev started by the plugin
// host (StartDrivers, as kubevisor-deviceplugins does): the kubelet's list and Allocate come
// from that process; when it is SIGKILLed every device turns Unhealthy, and once the host has
// restarted it the devices are Healthy again and allocate.
func TestDriverPluginProcess(t *testing.T) {
	host, _, k, _ := startHostdevProcess(t, 3)
	regs := k.registrations(t, 5, 10*time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	next := watchList(t, ctx, k, regs[v1alpha1.KVMDeviceResource].Endpoint, v1alpha1.KVMDeviceResource)
	if devs := next(); len(devs) != 3 || devs[0].Health != pluginapi.Healthy {
		t.Fatalf("first kvm list %v, want 3 healthy slots", devs)
	}
	allocate := func() (*pluginapi.AllocateResponse, error) {
		return k.client(t, regs[devicesGPU].Endpoint).Allocate(ctx, &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:01:00.0"}}}})
	}
	resp, err := allocate()
	if err != nil || resp.ContainerResponses[0].Envs["PCI_RESOURCE_DEVICES_KUBEVISOR_IO_GPU"] != "0000:01:00.0" {
		t.Fatalf("Allocate(gpu) = %v, %v", resp, err)
	}

	pid := host.Status("hostdev").Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Unhealthy while the driver is gone, unless the host restarted it before the plugin
	// noticed; Healthy again either way.
	sawUnhealthy := false
	deadline := time.Now().Add(20 * time.Second)
	for {
		devs := next()
		if len(devs) == 3 && allHealth(devs)[0] == pluginapi.Unhealthy {
			sawUnhealthy = true
			continue
		}
		if sawUnhealthy && len(devs) == 3 && len(allHealth(devs)) == 1 && devs[0].Health == pluginapi.Healthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvm list %v 20s after killing the driver", devs)
		}
	}
	if st := host.Status("hostdev"); st.Pid == pid || st.Restarts < 1 {
		t.Errorf("driver status %+v: want a new process", st)
	}
	// Each resource's plugin learns of the restarted driver's devices on its own Watch: kvm's
	// being healthy again does not mean gpu's is yet (its devices are refused as unhealthy until
	// then, as the kubelet would not offer them).
	for {
		resp, err := allocate()
		if err == nil && len(resp.ContainerResponses[0].Devices) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Allocate(gpu) 20s after killing the driver = %v, %v", resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

const devicesGPU = v1alpha1.DeviceResourcePrefix + "gpu"

// TestHostDevicesLive: the live permitted host devices reach kubevisor-driver-hostdev, a
// plugin process of the host, and the kubelet (HostDevices.Set, as kubevisor-deviceplugins's
// watcher calls it): nic replaces gpu; a change the driver refuses names the field and changes
// nothing; after a crash the driver comes back with the live devices; nil is the node's again.
func TestHostDevicesLive(t *testing.T) {
	host, mgr, k, m := startHostdevProcess(t, 2)
	k.registrations(t, 5, 10*time.Second)
	live := &HostDevices{Host: host, Base: m.Config, Manager: mgr}
	nic := &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "8086:1572", ResourceName: "nic"}}}
	want := func(what string, rs ...string) {
		t.Helper()
		all := append([]string{v1alpha1.KVMDeviceResource, v1alpha1.SEVDeviceResource, v1alpha1.TunDeviceResource, v1alpha1.VhostNetDeviceResource}, rs...)
		slices.Sort(all)
		if got := resources(mgr); !slices.Equal(got, all) {
			t.Errorf("%s: plugins %v, want %v", what, got, all)
		}
	}

	if err := live.Set(t.Context(), nic); err != nil {
		t.Fatalf("Set(nic): %v", err)
	}
	want("nic permitted", devicesNIC)
	if r := k.registrations(t, 1, 10*time.Second)[devicesNIC]; r == nil {
		t.Fatal("nic did not register")
	}

	kvm := &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "8086:1572", ResourceName: "kvm"}}}
	err := live.Set(t.Context(), kvm)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `config.permittedHostDevices.pciHostDevices[0].resourceName "kvm": already a character device`) {
		t.Errorf("Set(kvm) = %v, want InvalidArgument naming the field", err)
	}
	want("after a refused change", devicesNIC)

	// A crash: the host starts the driver again with the live devices, not the node's.
	pid := host.Status("hostdev").Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for st := host.Status("hostdev"); !st.Running || st.Pid == pid; st = host.Status("hostdev") {
		if time.Now().After(deadline) {
			t.Fatalf("driver not restarted: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, _, err := mgr.Resync(t.Context()); err != nil {
		t.Fatal(err)
	}
	want("after the driver restarted", devicesNIC)

	// The ConfigMap gone: the node's configuration again.
	if err := live.Set(t.Context(), nil); err != nil {
		t.Fatalf("Set(nil): %v", err)
	}
	want("the node's again", devicesGPU)
}
