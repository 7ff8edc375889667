package qmp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// fakeCPUID answers the SEV leaves: max extended leaf, then 0x8000001F.
func fakeCPUID(maxExt, eax, ebx uint32) func(uint32) (uint32, uint32, uint32, uint32) {
	return func(leaf uint32) (uint32, uint32, uint32, uint32) {
		switch leaf {
		case 0x80000000:
			return maxExt, 0, 0, 0
		case 0x8000001F:
			return eax, ebx, 0, 0
		}
		return 0, 0, 0, 0
	}
}

func sysfsWithSEV(t *testing.T, value string) string {
	t.Helper()
	root := t.TempDir()
	if value == "" {
		return root
	}
	dir := filepath.Join(root, "module/kvm_amd/parameters")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sev"), []byte(value+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestDetectSEV(t *testing.T) {
	// EPYC: C-bit 47, 1 reduced bit (EBX = 47 | 1<<6), SEV and SEV-ES (EAX bits 1 and 3).
	epyc := fakeCPUID(0x80000021, 1<<1|1<<3, 47|1<<6)
	cases := []struct {
		name   string
		param  string
		dev    bool
		cpuid  func(uint32) (uint32, uint32, uint32, uint32)
		want   *SEVHost
		reason string
	}{
		{name: "offered", param: "Y", dev: true, cpuid: epyc, want: &SEVHost{CBitPos: 47, ReducedPhysBits: 1, ES: true}},
		{name: "numeric parameter, no ES", param: "1", dev: true, cpuid: fakeCPUID(0x8000001F, 1<<1, 51|5<<6), want: &SEVHost{CBitPos: 51, ReducedPhysBits: 5}},
		{name: "no kvm_amd", dev: true, cpuid: epyc, reason: "kvm_amd"},
		{name: "disabled in the kernel", param: "N", dev: true, cpuid: epyc, reason: `sev parameter is "N"`},
		{name: "no /dev/sev", param: "Y", cpuid: epyc, reason: "/dev/sev"},
		{name: "no leaf", param: "Y", dev: true, cpuid: fakeCPUID(0x8000001E, 0, 0), reason: "no SEV leaf"},
		{name: "leaf without SEV", param: "Y", dev: true, cpuid: fakeCPUID(0x8000001F, 1<<0, 47), reason: "does not offer SEV"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason := DetectSEV(sysfsWithSEV(t, c.param), c.dev, c.cpuid)
			switch {
			case c.want == nil && got != nil:
				t.Fatalf("DetectSEV = %+v, want none (%s)", got, c.reason)
			case c.want != nil && (got == nil || *got != *c.want):
				t.Fatalf("DetectSEV = %+v (%s), want %+v", got, reason, c.want)
			case c.want == nil && !strings.Contains(reason, c.reason):
				t.Fatalf("reason %q does not say %q", reason, c.reason)
			}
		})
	}
}

// TestCPUIDVendor checks the hand-written CPUID against the kernel's reading of the same CPU.
func TestCPUIDVendor(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatalf("no /proc/cpuinfo to check CPUID against: %v", err)
	}
	_, ebx, ecx, edx := cpuid(0)
	var vendor []byte
	for _, r := range []uint32{ebx, edx, ecx} {
		vendor = append(vendor, byte(r), byte(r>>8), byte(r>>16), byte(r>>24))
	}
	if !strings.Contains(string(info), "vendor_id\t: "+string(vendor)) {
		t.Fatalf("CPUID(0) vendor %q is not /proc/cpuinfo's", vendor)
	}
}

func sevSpec(policy uint32) *domainv1.DomainSpec {
	s := baseSpec()
	s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}}
	s.Rng = &domainv1.RNG{}
	s.Balloon = &domainv1.Balloon{}
	s.Disks = []*domainv1.Disk{{Name: "root", Path: "/var/lib/vm1/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO}}
	s.LaunchSecurity = &domainv1.LaunchSecurity{Sev: &domainv1.SEV{Policy: policy}}
	return s
}

func sevEnv() HostEnv {
	env := baseEnv()
	env.Accel = AccelKVM
	env.SEV = &SEVHost{CBitPos: 47, ReducedPhysBits: 1, ES: true}
	return env
}

func TestBuildArgsSEV(t *testing.T) {
	cl, err := BuildArgs(sevSpec(0x5), sevEnv())
	if err != nil {
		t.Fatal(err)
	}
	if !hasArgs(cl.Args, "-object", "sev-guest,id=sev0,cbitpos=47,reduced-phys-bits=1,policy=0x5") {
		t.Errorf("no sev-guest object:\n%s", strings.Join(cl.Args, " "))
	}
	virtio := 0
	for i, a := range cl.Args {
		if a == "-machine" && !strings.Contains(cl.Args[i+1], ",memory-encryption=sev0") {
			t.Errorf("-machine %s has no memory-encryption", cl.Args[i+1])
		}
		if a != "-device" || !strings.HasPrefix(cl.Args[i+1], "virtio-") {
			continue
		}
		virtio++
		model, _, _ := strings.Cut(cl.Args[i+1], ",")
		want := ",disable-legacy=on,iommu_platform=on"
		if strings.HasSuffix(model, "-non-transitional") {
			want = ",iommu_platform=on" // modern only already; no disable-legacy property
		}
		if !strings.HasSuffix(cl.Args[i+1], want) {
			t.Errorf("virtio device %s is not behind the platform IOMMU", cl.Args[i+1])
		}
	}
	if virtio < 3 { // disk, rng, balloon
		t.Errorf("%d virtio devices checked, want at least 3:\n%s", virtio, strings.Join(cl.Args, " "))
	}

	// Without SEV nothing changes.
	plain := sevSpec(0)
	plain.LaunchSecurity = nil
	cl, err = BuildArgs(plain, sevEnv())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cl.Args {
		if strings.Contains(a, "sev") || strings.Contains(a, "iommu_platform") || strings.Contains(a, "memory-encryption") {
			t.Errorf("a VM without launch security has %q", a)
		}
	}
}

func TestBuildArgsSEVRefused(t *testing.T) {
	noSEV := sevEnv()
	noSEV.SEV, noSEV.SEVReason = nil, "kvm_amd's sev parameter is \"N\""
	noES := sevEnv()
	noES.SEV.ES = false
	emulated := sevEnv()
	emulated.Accel = AccelTCG
	bios := sevSpec(1)
	bios.Firmware = nil
	cases := []struct {
		name string
		spec *domainv1.DomainSpec
		env  HostEnv
		code codes.Code
		says string
	}{
		{"emulated", sevSpec(1), emulated, codes.FailedPrecondition, "launchSecurity.sev: AMD SEV needs hardware virtualisation"},
		{"node without SEV", sevSpec(1), noSEV, codes.FailedPrecondition, `launchSecurity.sev: this node offers no AMD SEV (kvm_amd's sev parameter is "N")`},
		{"ES on a node without it", sevSpec(5), noES, codes.FailedPrecondition, "launchSecurity.sev.policy: this node's CPU offers SEV but not SEV-ES"},
		{"BIOS", bios, sevEnv(), codes.InvalidArgument, "launchSecurity.sev: needs EFI firmware"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := BuildArgs(c.spec, c.env)
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v (%s), want %s saying %q", err, status.Code(err), c.code, c.says)
			}
		})
	}
}

func TestFingerprintSEV(t *testing.T) {
	h := &HostInfo{Version: "7.2.0", KVM: true, SEV: &SEVHost{CBitPos: 47, ES: true}}
	if got := h.Fingerprint().GetAttributes()["sev"]; got != "sev-es" {
		t.Errorf("sev attribute %q, want sev-es", got)
	}
	h.SEV = nil
	if got, ok := h.Fingerprint().GetAttributes()["sev"]; ok {
		t.Errorf("sev attribute %q without SEV", got)
	}
}
