package webhook

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestDefault(t *testing.T) {
	masquerade := v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}}
	tests := []struct {
		name   string
		opts   DefaultOptions
		change func(s *v1alpha1.VirtualMachineInstanceSpec)
		check  func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec)
	}{
		{
			name: "minimal spec",
			opts: DefaultOptions{HypervisorClassName: "qemu"},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				want := minimalSpec()
				want.Domain.Machine = &v1alpha1.Machine{Type: "q35"}
				want.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1}
				want.Domain.Devices.Disks[0].Disk = &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}
				want.Networks = []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
				want.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", InterfaceBindingMethod: masquerade}}
				want.HypervisorClassName = "qemu"
				if d := cmp.Diff(want, s); d != "" {
					t.Fatalf("defaulted spec (-want +got):\n%s", d)
				}
			},
		},
		{
			name: "what the spec says is kept",
			opts: DefaultOptions{HypervisorClassName: "qemu", MachineType: "pc"},
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Machine = &v1alpha1.Machine{Type: "pc-q35-7.2"}
				s.Domain.Devices.Disks[0].Disk = &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI}
				s.HypervisorClassName = "libvirt"
				s.Domain.CPU = &v1alpha1.CPU{Cores: 4}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if s.Domain.Machine.Type != "pc-q35-7.2" || s.Domain.Devices.Disks[0].Disk.Bus != v1alpha1.DiskBusSCSI || s.HypervisorClassName != "libvirt" {
					t.Fatalf("overwrote the spec: %+v", s)
				}
				if c := s.Domain.CPU; c.Sockets != 1 || c.Cores != 4 || c.Threads != 1 {
					t.Fatalf("cpu %+v, want 1/4/1", c)
				}
			},
		},
		{
			name: "networkInterfaceMultiqueue and useVirtioTransitional: not defaulted (unset is one queue and modern virtio, as KubeVirt's)",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				yes := true
				s.Domain.Devices.NetworkInterfaceMultiQueue = &yes
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if q := s.Domain.Devices.NetworkInterfaceMultiQueue; q == nil || !*q {
					t.Fatalf("networkInterfaceMultiqueue %v, want true as given", q)
				}
				if s.Domain.Devices.UseVirtioTransitional != nil {
					t.Fatalf("useVirtioTransitional %v, want unset", *s.Domain.Devices.UseVirtioTransitional)
				}
			},
		},
		{
			name: "autoattachPodInterface false: no interface",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				no := false
				s.Domain.Devices.AutoattachPodInterface = &no
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if len(s.Networks) != 0 || len(s.Domain.Devices.Interfaces) != 0 {
					t.Fatalf("networks %+v, interfaces %+v: want none", s.Networks, s.Domain.Devices.Interfaces)
				}
			},
		},
		{
			name: "configured machine type",
			opts: DefaultOptions{MachineType: "pc"},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if s.Domain.Machine.Type != "pc" {
					t.Fatalf("machine type %q", s.Domain.Machine.Type)
				}
			},
		},
		{
			name: "cdrom bus",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].CDRom = &v1alpha1.CDRomTarget{}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if d := s.Domain.Devices.Disks[0]; d.Disk != nil || d.CDRom.Bus != v1alpha1.DiskBusSATA {
					t.Fatalf("disk %+v", d)
				}
			},
		},
		{
			name: "lun bus",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Devices.Disks[0].LUN = &v1alpha1.LunTarget{}
				s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/dev/sdb", Type: v1alpha1.HostDiskExists}}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if d := s.Domain.Devices.Disks[0]; d.Disk != nil || d.LUN.Bus != v1alpha1.DiskBusSCSI {
					t.Fatalf("disk %+v", d)
				}
			},
		},
		{
			name: "vCPUs from the cpu limit, as the node builds them",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Domain.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("1")
				s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2500m")}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				if c := s.Domain.CPU; c.Sockets != 3 || c.Cores != 1 || c.Threads != 1 {
					t.Fatalf("cpu %+v, want 3/1/1", c)
				}
			},
		},
		{
			name: "interfaces given: no pod network added, bindings by network",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = []v1alpha1.Network{
					{Name: "pod", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}},
					{Name: "lan", NetworkSource: v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "lan"}}},
				}
				s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "pod"}, {Name: "lan"}}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				ifs := s.Domain.Devices.Interfaces
				if len(s.Networks) != 2 || len(ifs) != 2 || ifs[0].Masquerade == nil || ifs[1].Bridge == nil {
					t.Fatalf("networks %+v interfaces %+v", s.Networks, ifs)
				}
			},
		},
		{
			name: "NTP servers in canonical form, as KubeVirt reads them",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.Networks = []v1alpha1.Network{{Name: "pod", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
				s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "pod", DHCPOptions: &v1alpha1.DHCPOptions{
					NTPServers: []string{"192.0.2.1", "010.000.002.001", "::ffff:192.0.2.3"},
				}}}
			},
			check: func(t *testing.T, s *v1alpha1.VirtualMachineInstanceSpec) {
				want := []string{"192.0.2.1", "10.0.2.1", "192.0.2.3"}
				if d := cmp.Diff(want, s.Domain.Devices.Interfaces[0].DHCPOptions.NTPServers); d != "" {
					t.Fatalf("ntpServers (-want +got):\n%s", d)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := minimalSpec()
			if tt.change != nil {
				tt.change(s)
			}
			Default(s, tt.opts)
			tt.check(t, s)
			if errs := Validate(s, field.NewPath("spec")); len(errs) > 0 {
				t.Fatalf("defaulted spec is invalid: %v", errs.ToAggregate())
			}
		})
	}
}

// TestKubeVirtExamplesAdmitted checks that the KubeVirt manifests core/api converts (the ones
// using only supported fields) pass Validate once defaulted.
func TestKubeVirtExamplesAdmitted(t *testing.T) {
	// Seeds 0 and 1 are this package's; then the testdata files in name order: migration.yaml
	// (no VMI spec), vm-cirros, vm-datavolume-unsupported (refused), vm-fedora,
	// vmi-all-sources (uses hot-plug), vmirs-cirros.
	seeds := seedSpecs(t)
	for _, i := range []int{3, 5, 7} {
		var s v1alpha1.VirtualMachineInstanceSpec
		if err := json.Unmarshal(seeds[i], &s); err != nil {
			t.Fatal(err)
		}
		Default(&s, DefaultOptions{})
		if errs := Validate(&s, field.NewPath("spec")); len(errs) > 0 {
			t.Errorf("seed %d: %v", i, errs.ToAggregate())
		}
	}
}
