package featuregate

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// gatedSpec uses every gated field: a hostDisk (volumes[1]), a host device and a GPU.
func gatedSpec() *v1alpha1.VirtualMachineInstanceSpec {
	s := &v1alpha1.VirtualMachineInstanceSpec{}
	s.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "img"}}},
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/data.img", Type: v1alpha1.HostDiskExists}}},
	}
	s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "nic", DeviceName: "devices.kubevisor.io/nic"}}
	s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "gpu", DeviceName: "devices.kubevisor.io/gpu"}}
	return s
}

func errStrings(errs field.ErrorList) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

func TestCheck(t *testing.T) {
	const hint = " is not enabled (add it to the Kubevisor's spec.configuration.featureGates)"
	set := func(names ...string) Set {
		s, err := NewSet(names...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		name    string
		path    *field.Path
		enabled Set
		want    []string
	}{
		{"none enabled: hostDisk and hostDevices refused, GPUs (GA) admitted", field.NewPath("spec"), Set{}, []string{
			"spec.volumes[1].hostDisk: Forbidden: feature gate HostDisk" + hint,
			"spec.domain.devices.hostDevices[0]: Forbidden: feature gate HostDevices" + hint,
		}},
		{"a VM's template", field.NewPath("spec", "template", "spec"), set(HostDevices), []string{
			"spec.template.spec.volumes[1].hostDisk: Forbidden: feature gate HostDisk" + hint,
		}},
		{"HostDisk only", field.NewPath("spec"), set(HostDisk, LiveMigration), []string{
			"spec.domain.devices.hostDevices[0]: Forbidden: feature gate HostDevices" + hint,
		}},
		{"both", field.NewPath("spec"), set(HostDisk, HostDevices), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := errStrings(Check(gatedSpec(), nil, c.path, c.enabled)); !slices.Equal(got, c.want) {
				t.Errorf("Check:\n got %q\nwant %q", got, c.want)
			}
		})
	}
	if errs := Check(&v1alpha1.VirtualMachineInstanceSpec{}, nil, field.NewPath("spec"), Set{}); len(errs) > 0 {
		t.Errorf("a spec with no gated field: %v", errs)
	}
}

// TestCheckUpdate: on update only what the update adds is refused.
func TestCheckUpdate(t *testing.T) {
	p := field.NewPath("spec", "template", "spec")
	old := gatedSpec()
	same := gatedSpec()
	same.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default"}} // another field changed
	if errs := Check(same, old, p, Set{}); len(errs) > 0 {
		t.Errorf("an update keeping the gated fields: %v", errs)
	}
	added := gatedSpec()
	added.Volumes = append(added.Volumes, v1alpha1.Volume{Name: "more", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/more.img", Type: v1alpha1.HostDiskExists}}})
	changed := gatedSpec()
	changed.Volumes[1].HostDisk.Path = "/etc/shadow"
	for name, spec := range map[string]*v1alpha1.VirtualMachineInstanceSpec{"added": added, "changed": changed} {
		errs := errStrings(Check(spec, old, p, Set{}))
		want := "spec.template.spec.volumes[1].hostDisk: Forbidden"
		if name == "added" {
			want = "spec.template.spec.volumes[2].hostDisk: Forbidden"
		}
		if len(errs) != 1 || errs[0][:len(want)] != want {
			t.Errorf("%s hostDisk: %q, want one error %q", name, errs, want)
		}
	}
	noneBefore := &v1alpha1.VirtualMachineInstanceSpec{}
	if errs := Check(gatedSpec(), noneBefore, p, Set{}); len(errs) != 2 {
		t.Errorf("an update adding the gated fields: %v, want hostDisk and hostDevices refused", errs)
	}
}
