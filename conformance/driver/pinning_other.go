//go:build !linux

package conformance

// checkCPUPinning reads where the VM's threads run from /proc, which only Linux has.
func (s *vmSuite) checkCPUPinning(t T) {
	t.Skipf("CPU/Pinning reads the VM's threads from Linux's /proc")
}
