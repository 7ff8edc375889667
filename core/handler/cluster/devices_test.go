package cluster

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// fakePodResources is the kubelet's pod-resources List over a unix socket.
type fakePodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	pods []*podresources.PodResources
}

func (f *fakePodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	return &podresources.ListPodResourcesResponse{PodResources: f.pods}, nil
}

func TestPodDevices(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvpr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "kubelet.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	dev := func(r string, ids ...string) *podresources.ContainerDevices {
		return &podresources.ContainerDevices{ResourceName: r, DeviceIds: ids}
	}
	podresources.RegisterPodResourcesListerServer(srv, &fakePodResources{pods: []*podresources.PodResources{
		{Name: "other", Namespace: "default", Containers: []*podresources.ContainerResources{{Name: "compute", Devices: []*podresources.ContainerDevices{dev("devices.kubevisor.io/gpu", "0000:09:00.0")}}}},
		{Name: "launcher-a", Namespace: "default", Containers: []*podresources.ContainerResources{
			{Name: "compute", Devices: []*podresources.ContainerDevices{
				dev("devices.kubevisor.io/kvm", "kvm-3"),
				dev("devices.kubevisor.io/gpu", "0000:01:00.0", "0000:02:00.0"),
				dev("devices.kubevisor.io/nic", "0000:04:00.0"),
				dev("nvidia.com/GA102", "GPU-1"),
			}},
			{Name: "guest-console-log"},
		}},
	}})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-a", Namespace: "default"}}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if got, err := podDevices(t.Context(), socket, vmi, pod); got != nil || err != nil {
		t.Errorf("a VMI with no gpus or hostDevices: %v, %v; want nothing asked", got, err)
	}
	vmi.Spec.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g1", DeviceName: "devices.kubevisor.io/gpu"}, {Name: "g2", DeviceName: "devices.kubevisor.io/gpu"}}
	vmi.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "n", DeviceName: "devices.kubevisor.io/nic"}, {Name: "v", DeviceName: "nvidia.com/GA102"}}
	got, err := podDevices(t.Context(), socket, vmi, pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || strings.Join(got["gpu"], ",") != "0000:01:00.0,0000:02:00.0" || strings.Join(got["nic"], ",") != "0000:04:00.0" {
		t.Errorf("podDevices = %v, want gpu and nic only (not the class's kvm, not another vendor's resource)", got)
	}

	vmi.Spec.Domain.Devices.HostDevices = append(vmi.Spec.Domain.Devices.HostDevices, v1alpha1.HostDevice{Name: "x", DeviceName: "devices.kubevisor.io/fpga"})
	if _, err := podDevices(t.Context(), socket, vmi, pod); err == nil || !strings.Contains(err.Error(), "no devices.kubevisor.io/fpga device of pod default/launcher-a") {
		t.Errorf("a resource the kubelet allocated nothing of: %v", err)
	}
	if _, err := podDevices(t.Context(), filepath.Join(dir, "missing.sock"), vmi, pod); err == nil || !strings.Contains(err.Error(), "missing.sock") {
		t.Errorf("no pod-resources socket: %v", err)
	}
}
