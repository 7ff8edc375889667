package assemble_test

import (
	"testing"

	"github.com/kubevisor/kubevisor/core/domain/assemble"
)

func TestStandIns(t *testing.T) {
	in := assemble.StandIns([]string{"root", "cloudinit"}, []string{"default", "second"})
	for _, v := range []string{"root", "cloudinit"} {
		if d := in.Disks[v]; d == nil || d.GetVolumeName() != v || d.GetPath() != "/stand-in/"+v {
			t.Errorf("disk %s: %v", v, d)
		}
	}
	if len(in.Disks) != 2 || len(in.Interfaces) != 2 {
		t.Errorf("%d disks and %d interfaces, want 2 and 2", len(in.Disks), len(in.Interfaces))
	}
	a, b := in.Interfaces["default"], in.Interfaces["second"]
	if a.GetName() != "default" || b.GetName() != "second" || a.GetTapName() == b.GetTapName() || a.GetMac() == b.GetMac() {
		t.Errorf("interfaces %v and %v: want their own names, taps and MACs", a, b)
	}
	if in.RunDir != assemble.StandInDir || in.Kernel.KernelPath != "/stand-in/kernel" {
		t.Errorf("run directory %q, kernel %v", in.RunDir, in.Kernel)
	}

	// Domain takes them for every driver result of a VMI: only the VMI's own problems remain.
	vmi := testVMI()
	var volumes, interfaces []string
	for _, v := range vmi.Spec.Volumes {
		volumes = append(volumes, v.Name)
	}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		interfaces = append(interfaces, i.Name)
	}
	if _, err := assemble.Domain(vmi, assemble.StandIns(volumes, interfaces)); err != nil {
		t.Errorf("Domain with stand-ins: %v", err)
	}
	vmi.Spec.Domain.Devices.Disks[0].Name = "missing"
	if _, err := assemble.Domain(vmi, assemble.StandIns(volumes, interfaces)); err == nil {
		t.Error("Domain with stand-ins accepts a disk without a volume")
	}
}
