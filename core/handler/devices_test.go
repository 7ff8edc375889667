package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

func TestVMIDeviceNames(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Spec.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g1", DeviceName: "devices.kubevisor.io/gpu"}, {Name: "other", DeviceName: "nvidia.com/gpu"}}
	vmi.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "h1", DeviceName: "devices.kubevisor.io/nic"}, {Name: "g2", DeviceName: "devices.kubevisor.io/gpu"}}
	for res, want := range map[string][]string{"gpu": {"g1", "g2"}, "nic": {"h1"}, "kvm": nil} {
		if got := vmiDeviceNames(vmi, res); !slices.Equal(got, want) {
			t.Errorf("vmiDeviceNames(%s) = %v, want %v", res, got, want)
		}
	}
}

// TestHostDevicesFromHostdev runs VMIs with GPUs through the handler with the hostdev device
// driver (kubevisor-driver-hostdev on a fake host) and the fake hypervisor: the sandbox's
// devices (as the kubelet allocated them) become the domain's host devices, named after the
// VMI's entries; an unhealthy one fails the sync naming it and leaves nothing behind.
func TestHostDevicesFromHostdev(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubevisor-driver-hostdev")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-hostdev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	host := hostdevtest.New(t)
	dev, err := plugin.ManifestFor(bin, driver.KindDevice, "hostdev")
	if err != nil {
		t.Fatal(err)
	}
	dev.Config = host.Config(t, "1h", 2, "10de:1eb8=gpu")
	set := fakeSet
	set.Device = "hostdev"
	e := newEnv(t, set, append(fakeManifests(t), dev))
	devices := map[types.UID]map[string][]string{
		"uid-gpus":     {"gpu": {"0000:02:00.0", "0000:01:00.0"}},
		"uid-gpu-gone": {"gpu": {"0000:01:00.0"}},
	}
	e.opts.Sandboxes = SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) Sandbox {
		return newTestSandbox(SandboxSpec{Devices: devices[vmi.UID]})
	})
	h := e.start()
	gpus := []v1alpha1.GPU{{Name: "first", DeviceName: "devices.kubevisor.io/gpu"}, {Name: "second", DeviceName: "devices.kubevisor.io/gpu"}}

	ok := testVMI("gpus", "uid-gpus", e.disk)
	ok.Spec.Domain.Devices.GPUs = gpus
	mustRun(t, h, ok)
	raw, err := os.ReadFile(filepath.Join(e.cfg.RunDir, string(ok.UID), fake.RecordFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		HostDevices []string `json:"hostDevices"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if want := []string{"first=0000:01:00.0", "second=0000:02:00.0"}; !slices.Equal(rec.HostDevices, want) {
		t.Errorf("the hypervisor got host devices %v, want %v", rec.HostDevices, want)
	}

	host.Remove(t, "/dev/vfio/12")
	bad := testVMI("gpu-gone", "uid-gpu-gone", e.disk)
	bad.Spec.Domain.Devices.GPUs = gpus[:1]
	st, err := doSync(t, h, bad)
	c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if err == nil || c == nil || c.Reason != ReasonDeviceFailed || !strings.Contains(c.Message, `"0000:01:00.0" (IOMMU group 12: /dev/vfio/12: no such device node)`) {
		t.Fatalf("Sync = %v, Synchronized %+v; want %s naming 0000:01:00.0 and why", err, c, ReasonDeviceFailed)
	}
	requireNothingLeft(t, h, bad.UID)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.Stop(ctx, ok, time.Second); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, h, ok.UID)
}

// TestSeveralDeviceDrivers runs VMIs on a node with several device drivers (the fake device
// driver three times, with resources of their own): each resource of a sandbox is allocated by
// the driver that lists it, a device with no PCI address reaches the hypervisor driver by name,
// resource and id (with the driver's device nodes and environment), and the class's own
// devices (kvm) give the domain no host device. A resource two drivers list fails the VMIs
// that have it, naming both; so does a device id the driver does not know or finds unhealthy,
// leaving nothing behind while the other VMIs keep running.
func TestSeveralDeviceDrivers(t *testing.T) {
	devDriver := func(name, config string) plugin.Manifest {
		m := manifest(t, bins.testdriver, driver.KindDevice, name, driver.KindDevice, "name="+name)
		m.Config = json.RawMessage(config)
		return m
	}
	set := fakeSet
	set.Device, set.Devices = "chars", []string{"sim", "other", "twice"}
	e := newEnv(t, set, append(fakeManifests(t),
		devDriver("chars", `{"resources": ["kvm", "tun"]}`),
		devDriver("sim", `{"resources": ["example-sim", "shared"], "unhealthy": ["example-sim-3"]}`),
		devDriver("other", `{"resources": ["gpu"]}`),
		devDriver("twice", `{"resources": ["shared"]}`)))
	devices := map[types.UID]map[string][]string{
		"uid-sim":       {"kvm": {"kvm-0"}, "tun": {"tun-1"}, "example-sim": {"example-sim-1"}, "gpu": {"gpu-2"}},
		"uid-shared":    {"kvm": {"kvm-1"}, "shared": {"shared-0"}},
		"uid-unknown":   {"kvm": {"kvm-2"}, "example-sim": {"example-sim-9"}},
		"uid-unhealthy": {"example-sim": {"example-sim-3"}},
		"uid-nobody":    {"fpga": {"fpga-0"}},
	}
	e.opts.Sandboxes = SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) Sandbox {
		return newTestSandbox(SandboxSpec{Devices: devices[vmi.UID]})
	})
	h := e.start()
	withDevice := func(name string, uid types.UID, res string) *v1alpha1.VirtualMachineInstance {
		vmi := testVMI(name, uid, e.disk)
		vmi.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "sim1", DeviceName: v1alpha1.DeviceResourcePrefix + res}}
		return vmi
	}

	ok := withDevice("sim", "uid-sim", "example-sim")
	ok.Spec.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g", DeviceName: "devices.kubevisor.io/gpu"}}
	mustRun(t, h, ok)
	raw, err := os.ReadFile(filepath.Join(e.cfg.RunDir, string(ok.UID), fake.RecordFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Devices []fake.RecordedHostDevice `json:"devices"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	want := []fake.RecordedHostDevice{
		{Name: "sim1", Resource: "example-sim", DeviceIDs: []string{"example-sim-1"}, DeviceDriver: "sim",
			DeviceNodes: []string{"/dev/null"}, Env: map[string]string{"KUBEVISOR_FAKE_EXAMPLE_SIM": "example-sim-1"}},
		{Name: "g", Resource: "gpu", DeviceIDs: []string{"gpu-2"}, DeviceDriver: "other",
			DeviceNodes: []string{"/dev/null"}, Env: map[string]string{"KUBEVISOR_FAKE_GPU": "gpu-2"}},
	}
	if !reflect.DeepEqual(rec.Devices, want) {
		t.Errorf("the hypervisor got host devices %+v, want %+v", rec.Devices, want)
	}
	if got := h.entryState(ok.UID).Drivers.DeviceNames(); !slices.Equal(got, []string{"chars", "sim", "other"}) {
		t.Errorf("the VMI's device drivers = %v, want chars, sim, other (the node's order)", got)
	}

	for _, c := range []struct {
		vmi      *v1alpha1.VirtualMachineInstance
		reason   string
		contains []string
	}{
		{withDevice("shared", "uid-shared", "shared"), ReasonDriverNotFound, []string{`resource "shared" is listed by device drivers "sim", "twice"`}},
		{withDevice("unknown", "uid-unknown", "example-sim"), ReasonDeviceFailed, []string{`resource "example-sim" (device driver "sim")`, `"example-sim-9"`}},
		{withDevice("unhealthy", "uid-unhealthy", "example-sim"), ReasonDeviceFailed, []string{`device "example-sim-3" is unhealthy`}},
		{withDevice("nobody", "uid-nobody", "fpga"), ReasonDriverNotFound, []string{`resource "fpga": no loaded device driver lists it`}},
	} {
		st, err := doSync(t, h, c.vmi)
		cond := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
		if err == nil || cond == nil || cond.Reason != c.reason {
			t.Errorf("%s: Sync = %v, Synchronized %+v; want %s", c.vmi.Name, err, cond, c.reason)
			continue
		}
		for _, s := range c.contains {
			if !strings.Contains(cond.Message, s) {
				t.Errorf("%s: message %q lacks %q", c.vmi.Name, cond.Message, s)
			}
		}
		requireNothingLeft(t, h, c.vmi.UID)
	}
	if st, err := doSync(t, h, ok); err != nil || st.Phase != v1alpha1.Running {
		t.Errorf("the first VMI after the others failed: %v, phase %s", err, st.Phase)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.Stop(ctx, ok, time.Second); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, h, ok.UID)
}

// TestPermittedHostDeviceSelectingNothing: a permittedHostDevices entry of the hostdev driver
// that selects no device on the node makes the driver degraded, and DriverHealth (which the
// cluster handler turns into a Warning event on the Node) names the entry and why; the other
// entries and the character devices still serve.
func TestPermittedHostDeviceSelectingNothing(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubevisor-driver-hostdev")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-hostdev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	host := hostdevtest.New(t)
	dev, err := plugin.ManifestFor(bin, driver.KindDevice, "hostdev")
	if err != nil {
		t.Fatal(err)
	}
	dev.Config = host.Config(t, "1h", 2, "10de:1eb8=gpu", "1af4:1041=virtio-net")
	set := fakeSet
	set.Device = "hostdev"
	h := newEnv(t, set, append(fakeManifests(t), dev)).start()
	want := "permittedHostDevices.pciHostDevices[1] (1af4:1041, resource virtio-net): no PCI function 1af4:1041 on this node"
	eventually(t, "hostdev degraded", 10*time.Second, func() error {
		for _, d := range h.DriverHealth() {
			if d.Kind == driver.KindDevice && d.Name == "hostdev" {
				if d.Health != HealthDegraded || !strings.Contains(d.Description, want) {
					return fmt.Errorf("hostdev: %+v, want degraded naming %q", d, want)
				}
				if strings.Contains(d.Description, "pciHostDevices[0]") {
					return fmt.Errorf("hostdev: %+v names the entry that selects devices", d)
				}
				return nil
			}
		}
		return fmt.Errorf("no hostdev in %+v", h.DriverHealth())
	})
	for _, d := range h.DriverHealth() {
		if d.Name == fakeHV && d.Health != HealthHealthy {
			t.Errorf("the fake hypervisor: %+v, want healthy", d)
		}
	}
}

// TestPermittedHostDevicesLive: the handler's hostdev driver takes other permitted host devices
// while VMIs run (SetPermittedHostDevices, as the live configuration's watcher calls it): a
// running VMI with a GPU of a resource then removed keeps running and stops cleanly, a new VMI
// is refused that resource and runs with the one added; a change the driver refuses names the
// field and changes nothing; nil is the node's configuration again.
func TestPermittedHostDevicesLive(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubevisor-driver-hostdev")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-hostdev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	host := hostdevtest.New(t)
	dev, err := plugin.ManifestFor(bin, driver.KindDevice, "hostdev")
	if err != nil {
		t.Fatal(err)
	}
	dev.Config = host.Config(t, "1h", 2, "10de:1eb8=gpu")
	set := fakeSet
	set.Device = "hostdev"
	e := newEnv(t, set, append(fakeManifests(t), dev))
	devices := map[types.UID]map[string][]string{
		"uid-gpu":  {"gpu": {"0000:01:00.0"}},
		"uid-gpu2": {"gpu": {"0000:02:00.0"}},
		"uid-nic":  {"nic": {"0000:04:00.0"}},
	}
	e.opts.Sandboxes = SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) Sandbox {
		return newTestSandbox(SandboxSpec{Devices: devices[vmi.UID]})
	})
	h := e.start()
	ctx := t.Context()
	withDevice := func(name string, uid types.UID, res string) *v1alpha1.VirtualMachineInstance {
		vmi := testVMI(name, uid, e.disk)
		vmi.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "dev", DeviceName: v1alpha1.DeviceResourcePrefix + res}}
		return vmi
	}
	resources := func() []string {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.caps["hostdev"].GetResources()
	}
	running := withDevice("gpu", "uid-gpu", "gpu")
	mustRun(t, h, running)

	nic := &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "8086:1572", ResourceName: "nic"}}}
	if err := h.SetPermittedHostDevices(ctx, nic); err != nil {
		t.Fatalf("SetPermittedHostDevices(nic): %v", err)
	}
	if got := resources(); !slices.Equal(got, []string{"kvm", "tun", "vhost-net", "sev", "nic"}) {
		t.Errorf("resources %v after nic replaced gpu", got)
	}
	if st := h.DriverPluginStatus("hostdev"); st.Restarts != 0 {
		t.Errorf("the driver was restarted: %+v", st)
	}
	if st, _ := h.Status(running.UID); st.Phase != v1alpha1.Running {
		t.Errorf("the VMI with a gpu: %s after gpu was removed, want Running", st.Phase)
	}
	_, err = doSync(t, h, withDevice("gpu2", "uid-gpu2", "gpu"))
	if err == nil || !strings.Contains(err.Error(), `resource "gpu": no loaded device driver lists it`) {
		t.Errorf("a new VMI with a gpu: %v, want it refused naming the resource", err)
	}
	requireNothingLeft(t, h, "uid-gpu2")
	mustRun(t, h, withDevice("nic", "uid-nic", "nic"))

	kvm := &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "8086:1572", ResourceName: "kvm"}}}
	err = h.SetPermittedHostDevices(ctx, kvm)
	if err == nil || !strings.Contains(err.Error(), `config.permittedHostDevices.pciHostDevices[0].resourceName "kvm": already a character device`) {
		t.Errorf("SetPermittedHostDevices(kvm) = %v, want the driver's refusal naming the field", err)
	}
	if got := resources(); !slices.Equal(got, []string{"kvm", "tun", "vhost-net", "sev", "nic"}) {
		t.Errorf("resources %v after a refused change, want nic's kept", got)
	}

	if err := h.SetPermittedHostDevices(ctx, nil); err != nil {
		t.Fatalf("SetPermittedHostDevices(nil): %v", err)
	}
	if got := resources(); !slices.Equal(got, []string{"kvm", "tun", "vhost-net", "sev", "gpu"}) {
		t.Errorf("resources %v with the node's configuration again", got)
	}
	for _, vmi := range []*v1alpha1.VirtualMachineInstance{running, withDevice("nic", "uid-nic", "nic")} {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := h.Stop(sctx, vmi, time.Second); err != nil {
			t.Errorf("stop %s: %v", vmi.Name, err)
		}
		cancel()
		requireNothingLeft(t, h, vmi.UID)
	}
}
