package e2e

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestManifestsDecodeStrictly: the YAML the specs apply is what they mean — it decodes into
// the API types with no unknown or misplaced field (an indentation slip would move one).
func TestManifestsDecodeStrictly(t *testing.T) {
	// The specs' VMIs name the suite's class (-hypervisor-class), once.
	saved := Cfg.HypervisorClass
	Cfg.HypervisorClass = "e2e-class"
	t.Cleanup(func() { Cfg.HypervisorClass = saved })
	var vm v1alpha1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(vmManifest("guest", "Always", "marker-1")), &vm); err != nil {
		t.Fatalf("VM manifest: %v\n%s", err, vmManifest("guest", "Always", "marker-1"))
	}
	spec := vm.Spec.Template.Spec
	if vm.Name != "guest" || vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != v1alpha1.RunStrategyAlways ||
		vm.Spec.Template.ObjectMeta.Labels["app"] != "guest" || len(spec.Volumes) != 2 ||
		spec.Volumes[0].ContainerDisk == nil || spec.Volumes[0].ContainerDisk.Image != Cfg.GuestImage ||
		!strings.Contains(spec.Volumes[1].CloudInitNoCloud.UserData, "# marker-1") ||
		len(spec.Domain.Devices.Interfaces) != 1 || spec.Domain.Devices.Interfaces[0].Masquerade == nil ||
		spec.HypervisorClassName != "e2e-class" {
		t.Errorf("VM decoded as %+v", vm)
	}
	var rs v1alpha1.VirtualMachineInstanceReplicaSet
	rsYAML := "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstanceReplicaSet\nmetadata:\n  name: web\nspec:\n  replicas: 3\n  selector:\n    matchLabels:\n      app: web\n" + indent(template("web", "r"), 2)
	if err := yaml.UnmarshalStrict([]byte(rsYAML), &rs); err != nil || rs.Spec.Template == nil || rs.Spec.Template.ObjectMeta.Labels["app"] != "web" {
		t.Errorf("replica set manifest: %v %+v", err, rs.Spec.Template)
	}
	var vmi v1alpha1.VirtualMachineInstance
	vmiYAML := "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: x\nspec:\n" + indent(guestSpec("n"), 2)
	if err := yaml.UnmarshalStrict([]byte(vmiYAML), &vmi); err != nil || vmi.Spec.HypervisorClassName != "e2e-class" || len(vmi.Spec.Volumes) != 2 {
		t.Errorf("VMI manifest: %v %+v", err, vmi.Spec)
	}
}
