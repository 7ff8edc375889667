// Package guest is the VMI spec of the project's test guest (hack/guest) as the cluster
// conformance suite and the cluster bench run it: its containerDisk image, NoCloud user-data the
// guest prints on its console, and its web server behind masquerade on port 80.
package guest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// DefaultImage is the test guest's containerDisk image as make images / load-images.sh import it.
const DefaultImage = "kubevisor/test-guest:latest"

// WebAnswer is what the test guest's web server answers.
const WebAnswer = "kubevisor-guest ok"

// Options choose what differs between uses of the guest.
type Options struct {
	// Image is the containerDisk image. Default: DefaultImage.
	Image string
	// Memory is the guest's memory. Default: 128Mi.
	Memory *resource.Quantity
	// CPURequest, when set, is the VMI's CPU request.
	CPURequest *resource.Quantity
	// UserData is a line the guest prints between its user-data markers.
	UserData string
	// HypervisorClass names the VMI's class ("": the default class).
	HypervisorClass string
}

// Spec is the VMI spec of the test guest.
func Spec(o Options) v1alpha1.VirtualMachineInstanceSpec {
	if o.Image == "" {
		o.Image = DefaultImage
	}
	mem := resource.MustParse("128Mi")
	if o.Memory != nil {
		mem = o.Memory.DeepCopy()
	}
	spec := v1alpha1.VirtualMachineInstanceSpec{
		HypervisorClassName:           o.HypervisorClass,
		TerminationGracePeriodSeconds: ptr.To[int64](10),
		Domain: v1alpha1.DomainSpec{
			Memory: &v1alpha1.Memory{Guest: &mem},
			Devices: v1alpha1.Devices{
				Disks: []v1alpha1.Disk{
					{Name: "containerdisk", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}},
					// The guest's kernel has no AHCI driver: no SATA cdrom.
					{Name: "cloudinitdisk", DiskDevice: v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}}},
				},
				Interfaces: []v1alpha1.Interface{{
					Name:                   "default",
					InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}},
					Ports:                  []v1alpha1.Port{{Name: "http", Port: 80}},
				}},
			},
		},
		Networks: []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}},
		Volumes: []v1alpha1.Volume{
			{Name: "containerdisk", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{
				Image: o.Image, ImagePullPolicy: corev1.PullIfNotPresent,
			}}},
			{Name: "cloudinitdisk", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{
				UserData: "#cloud-config\n# " + o.UserData + "\n",
			}}},
		},
	}
	if o.CPURequest != nil {
		spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: o.CPURequest.DeepCopy()}
	}
	return spec
}
