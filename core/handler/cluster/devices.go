package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources API, which says which device ids the
// kubelet's device plugins allocated to each container.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// podResourcesTimeout bounds one question to the kubelet's pod-resources API.
const podResourcesTimeout = 10 * time.Second

// vmiDeviceResources are the device driver resources (devices.kubevisor.io/<name>, as
// "<name>") that the VMI's gpus[] and hostDevices[] are allocated from: the devices that become
// host devices in its domain spec. The class's device resources (kvm, tun) are not among them:
// the kubelet hands their nodes to the compute container and the domain names no device.
func vmiDeviceResources(vmi *v1alpha1.VirtualMachineInstance) []string {
	var out []string
	add := func(name string) {
		if r, ok := strings.CutPrefix(name, v1alpha1.DeviceResourcePrefix); ok && r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for _, g := range vmi.Spec.Domain.Devices.GPUs {
		add(g.DeviceName)
	}
	for _, h := range vmi.Spec.Domain.Devices.HostDevices {
		add(h.DeviceName)
	}
	return out
}

// podDevices returns the device ids the kubelet allocated to the launcher pod's compute
// container of the VMI's gpus[] and hostDevices[] resources (vmiDeviceResources), by resource
// as the device driver names it: the handler's SandboxSpec.Devices, which the pipeline hands to
// the device driver's Allocate for the domain spec's host devices. A VMI with none asks nothing.
// A resource the kubelet allocated nothing of is an error naming it.
func podDevices(ctx context.Context, socket string, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (map[string][]string, error) {
	want := vmiDeviceResources(vmi)
	if len(want) == 0 {
		return nil, nil
	}
	if pod == nil {
		return nil, fmt.Errorf("devices %v: no launcher pod on this node", want)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Clean(socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources %s: %w", socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	// List rather than Get: Get is behind the kubelet's KubeletPodResourcesGet gate.
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources %s: list: %w", socket, err)
	}
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		if p.GetName() != pod.Name || p.GetNamespace() != pod.Namespace {
			continue
		}
		for _, c := range p.GetContainers() {
			if c.GetName() != layout.ComputeContainer {
				continue
			}
			for _, d := range c.GetDevices() {
				r, ok := strings.CutPrefix(d.GetResourceName(), v1alpha1.DeviceResourcePrefix)
				if ok && slices.Contains(want, r) {
					out[r] = append(out[r], d.GetDeviceIds()...)
				}
			}
		}
	}
	var missing []string
	for _, r := range want {
		if len(out[r]) == 0 {
			missing = append(missing, v1alpha1.DeviceResourcePrefix+r)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the kubelet lists no %s device of pod %s/%s's %s container", strings.Join(missing, ", "), pod.Namespace, pod.Name, layout.ComputeContainer)
	}
	return out, nil
}
