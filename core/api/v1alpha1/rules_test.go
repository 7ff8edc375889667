package v1alpha1

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seconds *int64
		want    int64
	}{
		{"unset: a pod's default", nil, 30},
		{"set", ptr.To[int64](120), 120},
		{"zero: killed at once", ptr.To[int64](0), 0},
		{"negative counts as unset", ptr.To[int64](-5), 30},
		{"beyond a time.Duration", ptr.To[int64](math.MaxInt64), math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &VirtualMachineInstanceSpec{TerminationGracePeriodSeconds: tc.seconds}
			if got := s.GracePeriodSeconds(); got != tc.want {
				t.Errorf("GracePeriodSeconds() = %d, want %d", got, tc.want)
			}
			want := time.Duration(tc.want) * time.Second
			if tc.want > int64(math.MaxInt64/time.Second) {
				want = math.MaxInt64
			}
			if got := s.GracePeriod(); got != want {
				t.Errorf("GracePeriod() = %v, want %v", got, want)
			}
		})
	}
}

func TestVCPUs(t *testing.T) {
	cpu := func(limit, request string) ResourceRequirements {
		var r ResourceRequirements
		if limit != "" {
			r.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limit)}
		}
		if request != "" {
			r.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(request)}
		}
		return r
	}
	const maxU32 = math.MaxUint32
	for _, tc := range []struct {
		name     string
		domain   DomainSpec
		want     int64
		wantFrom VCPUSource
	}{
		{"nothing: one vCPU", DomainSpec{}, 1, VCPUsDefault},
		{"empty topology", DomainSpec{CPU: &CPU{Model: "host-model"}}, 1, VCPUsDefault},
		{"topology", DomainSpec{CPU: &CPU{Sockets: 2, Cores: 3, Threads: 2}}, 12, VCPUsFromTopology},
		{"topology field left 0 counts as 1", DomainSpec{CPU: &CPU{Cores: 4}}, 4, VCPUsFromTopology},
		{"topology wins over resources", DomainSpec{CPU: &CPU{Sockets: 2}, Resources: cpu("8", "8")}, 2, VCPUsFromTopology},
		{"topology beyond int64 saturates", DomainSpec{CPU: &CPU{Sockets: maxU32, Cores: maxU32, Threads: maxU32}}, math.MaxInt64, VCPUsFromTopology},
		{"limit, rounded up", DomainSpec{Resources: cpu("1500m", "")}, 2, VCPUsFromCPULimit},
		{"limit wins over request", DomainSpec{Resources: cpu("3", "1")}, 3, VCPUsFromCPULimit},
		{"request when the limit is 0", DomainSpec{Resources: cpu("0", "2")}, 2, VCPUsFromCPURequest},
		{"request, a milli-CPU is a vCPU", DomainSpec{Resources: cpu("", "1m")}, 1, VCPUsFromCPURequest},
		{"request of whole CPUs", DomainSpec{Resources: cpu("", "4")}, 4, VCPUsFromCPURequest},
		{"negative limit", DomainSpec{Resources: cpu("-2", "")}, -2, VCPUsFromCPULimit},
		{"negative fraction rounds away from zero", DomainSpec{Resources: cpu("-500m", "")}, -1, VCPUsFromCPULimit},
		{"huge limit saturates", DomainSpec{Resources: cpu("1e30", "")}, math.MaxInt64, VCPUsFromCPULimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, from := tc.domain.VCPUs()
			if n != tc.want || from != tc.wantFrom {
				t.Errorf("VCPUs() = %d, %q; want %d, %q", n, from, tc.want, tc.wantFrom)
			}
		})
	}
}

func TestSerialConsoleLogged(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		autoattach, log *bool
		want            bool
	}{
		{nil, nil, true}, {&yes, nil, true}, {nil, &yes, true}, {&yes, &yes, true},
		{nil, &no, false}, {&no, nil, false}, {&no, &yes, false}, {&yes, &no, false},
	} {
		s := VirtualMachineInstanceSpec{Domain: DomainSpec{Devices: Devices{AutoattachSerialConsole: tc.autoattach, LogSerialConsole: tc.log}}}
		if got := s.SerialConsoleLogged(); got != tc.want {
			t.Errorf("autoattachSerialConsole %v, logSerialConsole %v: SerialConsoleLogged = %v, want %v", ptrStr(tc.autoattach), ptrStr(tc.log), got, tc.want)
		}
	}
}

func ptrStr(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}

func TestHardwareVirtualisationFields(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name string
		d    DomainSpec
		want []string
	}{
		{name: "nothing", d: DomainSpec{}},
		{
			name: "what emulation has, or lacks anyway",
			d: DomainSpec{
				CPU:      &CPU{Model: "host-model"},
				Features: &Features{ACPI: FeatureState{Enabled: &no}, SMM: &FeatureState{}, APIC: &FeatureAPIC{}, KVM: &FeatureKVM{}, Pvspinlock: &FeatureState{Enabled: &no}},
				Clock:    &Clock{Timer: &Timer{HPET: &HPETTimer{Enabled: &no}, RTC: &RTCTimer{TickPolicy: "catchup"}, KVM: &KVMTimer{Enabled: &no}, Hyperv: &HypervTimer{Enabled: &no}}},
			},
		},
		{
			name: "every field that needs KVM",
			d: DomainSpec{
				CPU:            &CPU{Model: "host-passthrough"},
				LaunchSecurity: &LaunchSecurity{SEV: &SEV{}},
				Features: &Features{APIC: &FeatureAPIC{EndOfInterrupt: true}, Hyperv: &FeatureHyperv{}, KVM: &FeatureKVM{Hidden: true},
					Pvspinlock: &FeatureState{Enabled: &yes}},
				Clock: &Clock{Timer: &Timer{KVM: &KVMTimer{}, Hyperv: &HypervTimer{Enabled: &yes}, PIT: &PITTimer{TickPolicy: "delay"}}},
			},
			want: []string{"cpu.model", "launchSecurity.sev", "features.apic.endOfInterrupt", "features.hyperv", "features.kvm.hidden", "features.pvspinlock",
				"clock.timer.kvm", "clock.timer.hyperv", "clock.timer.pit.tickPolicy"},
		},
	} {
		if got := tc.d.HardwareVirtualisationFields(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: HardwareVirtualisationFields = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestGuestHostname(t *testing.T) {
	long := strings.Repeat("a", 62) + ".b" + strings.Repeat("c", 10)
	for _, tc := range []struct{ name, hostname, want string }{
		{"vm1", "", "vm1"},
		{"web.example", "", "web-example"},
		{"web.example", "db-0", "db-0"},
		{long, "", strings.Repeat("a", 62)}, // cut at 63, the trailing dash dropped
	} {
		vmi := &VirtualMachineInstance{}
		vmi.Name, vmi.Spec.Hostname = tc.name, tc.hostname
		if got := vmi.GuestHostname(); got != tc.want {
			t.Errorf("GuestHostname(%q, %q) = %q, want %q", tc.name, tc.hostname, got, tc.want)
		}
	}
}

func TestLocalWritableDisks(t *testing.T) {
	yes := true
	var s VirtualMachineInstanceSpec
	s.Domain.Devices.Disks = []Disk{
		{Name: "boot"}, {Name: "scratch"}, {Name: "ro-scratch", DiskDevice: DiskDevice{Disk: &DiskTarget{ReadOnly: true}}},
		{Name: "cd", DiskDevice: DiskDevice{CDRom: &CDRomTarget{}}}, {Name: "cloudinit"}, {Name: "shared"}, {Name: "no-volume"},
		{Name: "rw-cd", DiskDevice: DiskDevice{CDRom: &CDRomTarget{ReadOnly: new(false)}}},
	}
	s.Volumes = []Volume{
		{Name: "boot", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "img"}}},
		{Name: "scratch", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{}}},
		{Name: "ro-scratch", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{}}},
		{Name: "cd", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "iso"}}},
		{Name: "cloudinit", VolumeSource: VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserData: "x"}}},
		{Name: "shared", VolumeSource: VolumeSource{HostDisk: &HostDisk{Path: "/d", Shared: &yes}}},
		{Name: "rw-cd", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{}}},
	}
	want := []LocalDisk{{Name: "boot", Overlay: true}, {Name: "scratch"}, {Name: "rw-cd"}}
	if got := s.LocalWritableDisks(); !slices.Equal(got, want) {
		t.Errorf("LocalWritableDisks() = %+v, want %+v", got, want)
	}
}
