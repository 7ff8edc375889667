package qmp

// cpuid executes the CPUID instruction for leaf (sub-leaf 0). Hand-written (cpuid_amd64.s):
// golang.org/x/sys/cpu keeps its CPUID unexported and github.com/klauspost/cpuid decodes
// feature flags but not the SEV leaf's C-bit position, which QEMU needs for an SEV guest.
func cpuid(leaf uint32) (eax, ebx, ecx, edx uint32)
