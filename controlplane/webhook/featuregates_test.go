package webhook

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

const gateHint = " is not enabled (add it to the Kubevisor's spec.configuration.featureGates)"

// gatedVMISpec is a valid spec with a hostDisk (volumes[1]), a host device and a GPU.
func gatedVMISpec() *v1alpha1.VirtualMachineInstanceSpec {
	s := validSpec()
	s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "data", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: "virtio"}}})
	s.Volumes = append(s.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
		HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/data.img", Type: v1alpha1.HostDiskExists}}})
	s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "nic", DeviceName: "devices.kubevisor.io/nic"}}
	s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "gpu", DeviceName: "devices.kubevisor.io/gpu"}}
	return s
}

func gatedVM() *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "vms"}, Spec: v1alpha1.VirtualMachineSpec{
		RunStrategy: ptr.To(v1alpha1.RunStrategyAlways),
		Template:    &v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: *gatedVMISpec()}}}
}

func gatedRS() *v1alpha1.VirtualMachineInstanceReplicaSet {
	labels := map[string]string{"app": "a"}
	return &v1alpha1.VirtualMachineInstanceReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "rs", Namespace: "vms"}, Spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: *gatedVMISpec()}}}
}

// gateCauses are the "field: message" of an Invalid error, nil for none.
func gateCauses(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("not an Invalid error: %v", err)
	}
	var out []string
	for _, c := range status.Status().Details.Causes {
		out = append(out, c.Field+": "+c.Message)
	}
	return out
}

func gates(t *testing.T, names ...string) *featuregate.Live {
	t.Helper()
	s, err := featuregate.NewSet(names...)
	if err != nil {
		t.Fatal(err)
	}
	return featuregate.NewLive(s)
}

// TestFeatureGatesAtAdmission: hostDisk and hostDevices refused unless their gate is on, with
// the field's path, in a VMI and in the templates of VMs and replica sets; GPUs admitted (GPU is
// GA, as in KubeVirt); the GA names change nothing.
func TestFeatureGatesAtAdmission(t *testing.T) {
	ctx := context.Background()
	disk := "Forbidden: feature gate HostDisk" + gateHint
	devices := "Forbidden: feature gate HostDevices" + gateHint
	for _, c := range []struct {
		name  string
		gates []string
		vmi   []string // the VMI's causes; a VM's and a replica set's are the same under spec.template.spec
	}{
		{"no gates", nil, []string{"spec.volumes[1].hostDisk: " + disk, "spec.domain.devices.hostDevices[0]: " + devices}},
		{"GA gates only", []string{featuregate.GPU, featuregate.LiveMigration, featuregate.NUMA}, []string{"spec.volumes[1].hostDisk: " + disk, "spec.domain.devices.hostDevices[0]: " + devices}},
		{"HostDisk", []string{featuregate.HostDisk}, []string{"spec.domain.devices.hostDevices[0]: " + devices}},
		{"HostDevices", []string{featuregate.HostDevices}, []string{"spec.volumes[1].hostDisk: " + disk}},
		{"both", []string{featuregate.HostDisk, featuregate.HostDevices}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &Admission{FeatureGates: gates(t, c.gates...)}
			_, err := vmiValidator{a}.ValidateCreate(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vmi"}, Spec: *gatedVMISpec()})
			if got := gateCauses(t, err); !slices.Equal(got, c.vmi) {
				t.Errorf("VMI:\n got %q\nwant %q", got, c.vmi)
			}
			var tmpl []string
			for _, v := range c.vmi {
				tmpl = append(tmpl, "spec.template.spec"+v[len("spec"):])
			}
			_, err = vmValidator{a}.ValidateCreate(ctx, gatedVM())
			if got := gateCauses(t, err); !slices.Equal(got, tmpl) {
				t.Errorf("VM:\n got %q\nwant %q", got, tmpl)
			}
			_, err = vmirsValidator{a}.ValidateCreate(ctx, gatedRS())
			if got := gateCauses(t, err); !slices.Equal(got, tmpl) {
				t.Errorf("replica set:\n got %q\nwant %q", got, tmpl)
			}
		})
	}
	// A VMI without gated fields needs no gate; nil gates enable none.
	if _, err := (vmiValidator{&Admission{}}).ValidateCreate(ctx, &v1alpha1.VirtualMachineInstance{Spec: *validSpec()}); err != nil {
		t.Errorf("a VMI without gated fields: %v", err)
	}
}

// TestFeatureGatesOnUpdate: with a gate off, an update keeping what the object had is admitted
// (the VM can be stopped), one adding a gated field is refused.
func TestFeatureGatesOnUpdate(t *testing.T) {
	ctx := context.Background()
	a := &Admission{FeatureGates: gates(t)}
	old := gatedVM()
	stopped := gatedVM()
	stopped.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyHalted)
	if _, err := (vmValidator{a}).ValidateUpdate(ctx, old, stopped); err != nil {
		t.Errorf("stopping a VM that kept its hostDisk: %v", err)
	}
	more := gatedVM()
	more.Spec.Template.Spec.Domain.Devices.HostDevices = append(more.Spec.Template.Spec.Domain.Devices.HostDevices,
		v1alpha1.HostDevice{Name: "nic2", DeviceName: "devices.kubevisor.io/nic"})
	_, err := vmValidator{a}.ValidateUpdate(ctx, old, more)
	if got, want := gateCauses(t, err), []string{"spec.template.spec.domain.devices.hostDevices[1]: Forbidden: feature gate HostDevices" + gateHint}; !slices.Equal(got, want) {
		t.Errorf("adding a host device:\n got %q\nwant %q", got, want)
	}
	oldRS, rs := gatedRS(), gatedRS()
	rs.Spec.Replicas = ptr.To[int32](3)
	if _, err := (vmirsValidator{a}).ValidateUpdate(ctx, oldRS, rs); err != nil {
		t.Errorf("scaling a replica set that kept its hostDisk: %v", err)
	}
	oldRS.Spec.Template.Spec = *validSpec()
	oldRS.Spec.Template.Spec.Domain.Devices.GPUs = rs.Spec.Template.Spec.Domain.Devices.GPUs
	if _, err := (vmirsValidator{a}).ValidateUpdate(ctx, oldRS, rs); len(gateCauses(t, err)) != 2 {
		t.Errorf("a replica set update adding a hostDisk and a host device: %v, want both refused", err)
	}
}

// TestFeatureGatesLiveSwap: the live configuration's applier swaps the set an Admission reads:
// the same Admission refuses, then admits, with no restart.
func TestFeatureGatesLiveSwap(t *testing.T) {
	ctx := context.Background()
	base, err := featuregate.ParseFlag("")
	if err != nil {
		t.Fatal(err)
	}
	live := featuregate.NewLive(base)
	a := &Admission{FeatureGates: live}
	apply := liveconfig.FeatureGates(live, base, logr.Discard())
	create := func() error {
		_, err := vmiValidator{a}.ValidateCreate(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vmi"}, Spec: *gatedVMISpec()})
		return err
	}
	if err := create(); err == nil {
		t.Fatal("admitted with every gate off (the flag's empty base)")
	}
	c := liveconfig.New()
	c.FeatureGates = []string{featuregate.HostDisk, featuregate.HostDevices}
	apply(c)
	if err := create(); err != nil {
		t.Fatalf("after the live configuration enabled both gates: %v", err)
	}
	c.FeatureGates = []string{}
	apply(c)
	if got := gateCauses(t, create()); len(got) != 2 {
		t.Fatalf("after the live configuration listed none: %q, want hostDisk and hostDevices refused", got)
	}
}
