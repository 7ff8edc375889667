//go:build !amd64

package qmp

// cpuid reports no leaves where there is no x86 CPUID: no SEV.
func cpuid(uint32) (eax, ebx, ecx, edx uint32) { return 0, 0, 0, 0 }
