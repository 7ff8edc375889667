package vmi

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestLiveMigratable(t *testing.T) {
	pvc := func(name string, spec, status []corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
		c.Spec.AccessModes, c.Status.AccessModes = spec, status
		return c
	}
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	rox := []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
	claims := map[string]*corev1.PersistentVolumeClaim{
		"shared":  pvc("shared", rwx, rwx),
		"local":   pvc("local", rwo, rwo),
		"asked":   pvc("asked", rwx, nil),   // not bound yet: its spec's modes
		"granted": pvc("granted", rwx, rwo), // bound with less than asked: its status's
		"golden":  pvc("golden", rox, rox),  // fine as an ephemeral's backing claim
		"mixed":   pvc("mixed", nil, append(rwo, rwx...)),
	}
	claimVol := func(vol, claim string) v1alpha1.Volume {
		v := v1alpha1.Volume{Name: vol}
		v.PersistentVolumeClaim = &v1alpha1.PersistentVolumeClaimVolumeSource{}
		v.PersistentVolumeClaim.ClaimName = claim
		return v
	}
	ephemeralVol := func(vol, claim string) v1alpha1.Volume {
		v := v1alpha1.Volume{Name: vol}
		v.Ephemeral = &v1alpha1.EphemeralVolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
		return v
	}
	hostDiskVol := func(vol string, shared *bool) v1alpha1.Volume {
		v := v1alpha1.Volume{Name: vol}
		v.HostDisk = &v1alpha1.HostDisk{Path: "/data/" + vol + ".img", Type: v1alpha1.HostDiskExists, Shared: shared}
		return v
	}
	own := func(vol string) v1alpha1.Volume {
		v := v1alpha1.Volume{Name: vol}
		v.ContainerDisk = &v1alpha1.ContainerDiskSource{Image: "disk:1"}
		return v
	}
	podNet := v1alpha1.Network{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}
	multus := v1alpha1.Network{Name: "storage", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "storage-net"}}}
	bridge := func(name string) v1alpha1.Interface {
		return v1alpha1.Interface{Name: name, InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}}
	}
	masquerade := func(name string) v1alpha1.Interface {
		return v1alpha1.Interface{Name: name, InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	}

	for _, tc := range []struct {
		name   string
		spec   func(*v1alpha1.VirtualMachineInstanceSpec)
		driver *bool
		disks  *bool
		// want is "True", or "False/<reason>" followed by what the message must hold, each "|"-separated.
		want string
	}{
		{name: "own disks, masquerade on the pod network", want: "True", spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Volumes = []v1alpha1.Volume{own("root")}
			s.Networks = []v1alpha1.Network{podNet}
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{masquerade("default")}
		}},
		{name: "bridge on the pod network", want: "False/InterfaceNotLiveMigratable|interface default: bridge binding on the pod network",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = []v1alpha1.Network{podNet}
				s.Domain.Devices.Interfaces = []v1alpha1.Interface{bridge("default")}
			}},
		{name: "bridge on a secondary network", want: "True", spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Networks = []v1alpha1.Network{podNet, multus}
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{masquerade("default"), bridge("storage")}
		}},
		{name: "hostDisk not shared", want: "False/DisksNotLiveMigratable|volume data: hostDisk /data/data.img is not shared",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = []v1alpha1.Volume{hostDiskVol("data", nil)} }},
		{name: "hostDisk shared false", want: "False/DisksNotLiveMigratable|volume data:",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{hostDiskVol("data", new(false))}
			}},
		{name: "hostDisk shared", want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{hostDiskVol("data", new(true))}
			}},
		{name: "RWX claim", want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{claimVol("root", "shared")}
			}},
		{name: "a claim with RWX among its modes", want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = []v1alpha1.Volume{claimVol("root", "mixed")} }},
		{name: "RWO claim", want: "False/DisksNotLiveMigratable|volume root: PersistentVolumeClaim local has access modes [ReadWriteOnce], not ReadWriteMany",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = []v1alpha1.Volume{claimVol("root", "local")} }},
		{name: "unbound claim asking RWX", want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = []v1alpha1.Volume{claimVol("root", "asked")} }},
		{name: "claim granted RWO for RWX asked", want: "False/DisksNotLiveMigratable|PersistentVolumeClaim granted has access modes [ReadWriteOnce]",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{claimVol("root", "granted")}
			}},
		{name: "claim missing", want: "False/DisksNotLiveMigratable|volume root: PersistentVolumeClaim gone does not exist",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Volumes = []v1alpha1.Volume{claimVol("root", "gone")} }},
		{name: "ephemeral over ROX", want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{ephemeralVol("root", "golden")}
			}},
		{name: "ROX claim attached as persistentVolumeClaim", want: "False/DisksNotLiveMigratable|not ReadWriteMany",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{claimVol("root", "golden")}
			}},
		{name: "ephemeral over RWO", want: "False/DisksNotLiveMigratable|ephemeral's PersistentVolumeClaim local|not ReadWriteMany or ReadOnlyMany",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{ephemeralVol("root", "local")}
			}},
		{name: "GPU", want: "False/HostDeviceNotLiveMigratable|GPU gpu1 (nvidia.com/GA102)",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "gpu1", DeviceName: "nvidia.com/GA102"}}
			}},
		{name: "host device", want: "False/HostDeviceNotLiveMigratable|host device nic1 (devices.kubevisor.io/sriov)",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "nic1", DeviceName: "devices.kubevisor.io/sriov"}}
			}},
		{name: "driver known not to migrate", driver: new(false), want: "False/DriverNotLiveMigratable|hypervisor driver qmp does not declare live migration on node node-a",
			spec: func(*v1alpha1.VirtualMachineInstanceSpec) {}},
		{name: "driver known to migrate", driver: new(true), want: "True", spec: func(*v1alpha1.VirtualMachineInstanceSpec) {}},
		{name: "node-local disks, a driver that copies no disk", driver: new(true), disks: new(false),
			want: "False/DisksNotLiveMigratable|volume root: a containerDisk, whose writable overlay is on its node alone|volume scratch: an emptyDisk|hypervisor driver qmp does not copy disks in a migration on node node-a",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{own("root"), {Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{}}}}
				s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}, {Name: "scratch"}}
			}},
		{name: "node-local disks, a driver that copies them", driver: new(true), disks: new(true), want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Volumes = []v1alpha1.Volume{own("root")}
				s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}}
			}},
		{name: "no node-local disk, a driver that copies none", driver: new(true), disks: new(false), want: "True",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {}},
		{name: "every obstacle named, the disks' reason first",
			want: "False/DisksNotLiveMigratable|interface default:|volume root: PersistentVolumeClaim local|GPU gpu1",
			spec: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = []v1alpha1.Network{podNet}
				s.Domain.Devices.Interfaces = []v1alpha1.Interface{bridge("default")}
				s.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "gpu1", DeviceName: "nvidia.com/GA102"}}
				s.Volumes = []v1alpha1.Volume{own("boot"), claimVol("root", "local")}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns"}}
			vmi.Status.NodeName = "node-a"
			tc.spec(&vmi.Spec)
			c := liveMigratable(vmi, "qmp", claims, tc.driver, tc.disks)
			if c.Type != v1alpha1.VirtualMachineInstanceIsMigratable {
				t.Fatalf("type = %s", c.Type)
			}
			parts := strings.Split(tc.want, "|")
			status, reason, _ := strings.Cut(parts[0], "/")
			if string(c.Status) != status || c.Reason != reason {
				t.Errorf("condition = %s/%s (%q), want %s/%s", c.Status, c.Reason, c.Message, status, reason)
			}
			if status == "True" && c.Message != "" {
				t.Errorf("message %q on a True condition", c.Message)
			}
			for _, want := range parts[1:] {
				if !strings.Contains(c.Message, want) {
					t.Errorf("message %q does not hold %q", c.Message, want)
				}
			}
		})
	}
}

// TestDeriveStatusSetsLiveMigratable checks that deriveStatus sets LiveMigratable with the VMI's
// generation in a phase that is not final, and leaves a final VMI's status alone.
func TestDeriveStatusSetsLiveMigratable(t *testing.T) {
	vmi := vmiWith(v1alpha1.Running, created)
	vmi.Spec.Networks = []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
	vmi.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}}}
	st := deriveStatus(vmi, observation{Pod: launcher(bound("node-1"), podPhase(corev1.PodRunning))}, t1)
	c := condition(st, v1alpha1.VirtualMachineInstanceIsMigratable)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != v1alpha1.ReasonInterfaceNotLiveMigratable || c.ObservedGeneration != 3 || !c.LastTransitionTime.Equal(&t1) {
		t.Errorf("LiveMigratable = %+v, want False InterfaceNotLiveMigratable, generation 3, since t1", c)
	}
	if got := controllerFields(st, false); condition(got, v1alpha1.VirtualMachineInstanceIsMigratable) == nil {
		t.Error("controllerFields leaves LiveMigratable out: the controller would not write it")
	}

	final := vmiWith(v1alpha1.Succeeded, created)
	final.Spec = vmi.Spec
	if st := deriveStatus(final, observation{}, t1); condition(st, v1alpha1.VirtualMachineInstanceIsMigratable) != nil {
		t.Error("LiveMigratable set on a final VMI")
	}
}
