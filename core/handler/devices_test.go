package handler

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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
