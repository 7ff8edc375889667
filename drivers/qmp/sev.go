package qmp

import (
	"fmt"
	"os"
	"strings"
)

// AMD SEV (domain spec launch_security.sev).
//
// QEMU launches an SEV guest with `-object sev-guest` (the policy, and the C-bit position and
// the physical address bits the encryption takes away, both read from the host CPU) and
// `-machine memory-encryption=`. The guest's memory is encrypted with a key only the CPU's
// secure processor holds, so devices cannot read it: every virtio device must go through the
// platform IOMMU (iommu_platform=on), where the guest's DMA API bounces through memory it
// shares. Only a node where KVM runs and the CPU and kernel offer SEV can do it; anywhere else
// the VM is refused with a host precondition (FailedPrecondition), never started without it.

// SEVHost is what the host offers for SEV guests.
type SEVHost struct {
	// CBitPos is the page table bit that marks a page encrypted (CPUID 0x8000001F EBX[5:0]).
	CBitPos uint32
	// ReducedPhysBits is how many physical address bits encryption takes (EBX[11:6]).
	ReducedPhysBits uint32
	// ES says SEV-ES is offered too (EAX bit 3).
	ES bool
}

// sevObjectID is the id of the sev-guest object on the command line.
const sevObjectID = "sev0"

// DetectSEV reads the kernel's kvm_amd sev parameter (under sysfs) and the CPU's SEV leaf
// (cpuid) and says what the host offers, or why not. devOK says /dev/sev opens.
func DetectSEV(sysfs string, devOK bool, cpuid func(leaf uint32) (eax, ebx, ecx, edx uint32)) (*SEVHost, string) {
	raw, err := os.ReadFile(sysfs + "/module/kvm_amd/parameters/sev")
	if err != nil {
		return nil, "kvm_amd is not loaded or has no sev parameter"
	}
	if v := strings.TrimSpace(string(raw)); v != "Y" && v != "1" {
		return nil, fmt.Sprintf("kvm_amd's sev parameter is %q", v)
	}
	if !devOK {
		return nil, "/dev/sev does not open"
	}
	if max, _, _, _ := cpuid(0x80000000); max < 0x8000001F {
		return nil, "the CPU has no SEV leaf (CPUID 0x8000001F)"
	}
	eax, ebx, _, _ := cpuid(0x8000001F)
	if eax&(1<<1) == 0 {
		return nil, "the CPU does not offer SEV (CPUID 0x8000001F EAX bit 1)"
	}
	return &SEVHost{CBitPos: ebx & 0x3f, ReducedPhysBits: (ebx >> 6) & 0x3f, ES: eax&(1<<3) != 0}, ""
}

// sevPolicyES is the ES bit of the SEV guest policy.
const sevPolicyES = 1 << 2

// launchSecurity adds the sev-guest object and returns the -machine option for it; "" when the
// spec asks for none.
func (b *argBuilder) launchSecurity() string {
	sev := b.spec.GetLaunchSecurity().GetSev()
	if sev == nil {
		return ""
	}
	const field = "launchSecurity.sev"
	b.needHardware(field, "AMD SEV")
	if b.spec.GetFirmware().GetEfi() == nil {
		b.fail(field, "needs EFI firmware")
	}
	host := b.env.SEV
	switch {
	case b.env.Accel != AccelKVM:
		return "" // needHardware said why
	case host == nil:
		if b.missing == "" {
			b.missing = fmt.Sprintf("%s: this node offers no AMD SEV (%s)", field, b.env.SEVReason)
		}
		return ""
	case sev.GetPolicy()&sevPolicyES != 0 && !host.ES:
		if b.missing == "" {
			b.missing = field + ".policy: this node's CPU offers SEV but not SEV-ES"
		}
		return ""
	}
	b.add("-object", fmt.Sprintf("sev-guest,id=%s,cbitpos=%d,reduced-phys-bits=%d,policy=%#x",
		sevObjectID, host.CBitPos, host.ReducedPhysBits, sev.GetPolicy()))
	b.sev = true
	return "memory-encryption=" + sevObjectID
}

// iommuPlatform puts every virtio PCI device behind the platform IOMMU, as an SEV guest needs:
// its memory is encrypted, so devices may only touch what the guest shares. QEMU refuses
// iommu_platform on a transitional device: the -non-transitional models (the default) are
// modern-only already, and a plain virtio-*-pci model is made so with disable-legacy=on (the
// -non-transitional models have no such property). The assembler refuses SEV with
// useVirtioTransitional.
func (b *argBuilder) iommuPlatform() {
	for i := 0; i+1 < len(b.args); i++ {
		if b.args[i] != "-device" {
			continue
		}
		dev := b.args[i+1]
		model, _, _ := strings.Cut(dev, ",")
		switch {
		case !strings.HasPrefix(model, "virtio-") || !strings.Contains(model, "-pci"):
		case strings.HasSuffix(model, "-non-transitional"):
			b.args[i+1] = dev + ",iommu_platform=on"
		case strings.HasSuffix(model, "-transitional"):
			b.fail("launchSecurity.sev", "the transitional virtio device %s cannot be behind the platform IOMMU", model)
		default:
			b.args[i+1] = dev + ",disable-legacy=on,iommu_platform=on"
		}
	}
}
