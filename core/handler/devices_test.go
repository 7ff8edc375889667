package handler

import (
	"slices"
	"testing"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
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
