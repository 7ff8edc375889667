package conformance

import (
	"os"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// checkTPMPersistent: a VM whose TPM is persistent keeps its state in the persistent state
// directory, and a new VM given the same directory after the first is deleted has the same
// TPM. The guest shows it by its TPM's reset count (Guest.TPMMarker's resets=N), which the TPM
// keeps in its state and counts up at every boot: the second VM's is above the first's. The
// directory must still hold something after Delete (the driver never removes it).
func (s *vmSuite) checkTPMPersistent(t T) {
	s.requireDevice(t, driver.DeviceTPM, s.guest.TPMMarker, "the guest does not print its TPM (Guest.TPMMarker)")
	if _, caps := s.hypervisor(t); !caps.GetPersistentState() {
		t.Skipf("the hypervisor does not declare Capabilities.persistent_state")
	}
	dir := t.TempDir()
	persistent := func(spec *domainv1.DomainSpec) {
		spec.Tpm, spec.PersistentStateDir = &domainv1.TPM{Persistent: true}, dir
	}

	first := s.bootWith(t, "", persistent)
	resets1, ok := s.tpmResets(t, first)
	if !ok {
		t.Skipf("the guest does not print its TPM's reset count (resets=N on its %q line)", s.guest.TPMMarker)
	}
	s.destroy(t, first)
	if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
		t.Fatalf("the persistent state directory holds nothing after the VM with the persistent TPM was deleted (%v): the driver did not keep the TPM's state there, or removed it", err)
	}

	second := s.bootWith(t, "", persistent)
	resets2, ok := s.tpmResets(t, second)
	switch {
	case !ok:
		t.Fatalf("the second VM's guest printed no TPM reset count; %s", second.console.out.Tail())
	case resets2 <= resets1:
		t.Errorf("the second VM's TPM has reset count %d, the first's %d: a new TPM, not the one whose state the persistent state directory was to keep", resets2, resets1)
	}
}

// checkFirmwareEFIPersistent: a VM booting the guest's disk with EFI firmware whose variable
// store is persistent keeps the store in the persistent state directory, and a new VM given
// the same directory after the first is deleted boots with the same store. The guest shows it
// by the boots its store has seen (Guest.EFIVarMarker's boots=N, a variable it adds at each
// boot): the second VM's is above the first's.
func (s *vmSuite) checkFirmwareEFIPersistent(t T) {
	_, caps := s.hypervisor(t)
	switch {
	case !slices.Contains(caps.GetFirmware(), "efi"):
		t.Skipf("the hypervisor does not declare firmware efi (Capabilities.firmware: %v)", caps.GetFirmware())
	case !caps.GetPersistentState():
		t.Skipf("the hypervisor does not declare Capabilities.persistent_state")
	case s.guest.Disk == "" || s.guest.EFIVarMarker == "":
		t.Skipf("the guest has no disk that boots with UEFI and counts its boots in the EFI variable store (Guest.Disk, Guest.EFIVarMarker)")
	}
	dir := t.TempDir()
	persistent := func(spec *domainv1.DomainSpec) {
		spec.Firmware.Boot = &domainv1.Firmware_Efi{Efi: &domainv1.EFI{Persistent: true}}
		spec.PersistentStateDir = dir
		booted := false
		for _, d := range spec.Disks {
			if d.GetName() == containerDiskVolume {
				d.BootOrder, booted = 1, true
			}
		}
		if !booted {
			t.Skipf("the storage driver does not declare volume type containerDisk, the guest's disk that boots with UEFI")
		}
	}

	first := s.bootWith(t, "", persistent)
	boots1 := s.efiBoots(t, first)
	s.destroy(t, first)
	if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
		t.Fatalf("the persistent state directory holds nothing after the VM with the persistent EFI variable store was deleted (%v): the driver did not keep the store there, or removed it", err)
	}

	second := s.bootWith(t, "", persistent)
	if boots2 := s.efiBoots(t, second); boots2 <= boots1 {
		t.Errorf("the second VM's EFI variable store has seen %d boots, the first's %d: a new store, not the one the persistent state directory was to keep", boots2, boots1)
	}
}

// efiBoots returns the boots the guest's EFI variable store has seen (boots=N).
func (s *vmSuite) efiBoots(t T, vm *guestVM) uint64 {
	t.Helper()
	lines := markerLines(vm.console.out.String(), s.guest.EFIVarMarker)
	if len(lines) == 0 {
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.EFIVarMarker, vm.console.out.Tail())
	}
	v, ok := strings.CutPrefix(lines[0], "boots=")
	n, err := strconv.ParseUint(v, 10, 32)
	if !ok || err != nil {
		t.Fatalf("the guest's EFI variables: %q, want boots=N: not booted with UEFI, or efivarfs not writable", lines[0])
	}
	return n
}

// tpmResets returns the reset count on the guest's TPM line (resets=N), false without one.
func (s *vmSuite) tpmResets(t T, vm *guestVM) (uint64, bool) {
	t.Helper()
	lines := markerLines(vm.console.out.String(), s.guest.TPMMarker)
	if len(lines) == 0 {
		t.Fatalf("the guest printed no %q line before it was ready; %s", s.guest.TPMMarker, vm.console.out.Tail())
	}
	fields := strings.Fields(lines[0])
	if !slices.Contains(fields, "version=2") {
		t.Fatalf("the guest's TPM is %q: no TPM 2.0, though the domain spec asked for one", lines[0])
	}
	for _, f := range fields {
		if v, ok := strings.CutPrefix(f, "resets="); ok {
			n, err := strconv.ParseUint(v, 10, 32)
			return n, err == nil
		}
	}
	return 0, false
}

// destroy kills and deletes a VM before its check ends (the check's cleanup then finds it gone).
func (s *vmSuite) destroy(t T, vm *guestVM) {
	t.Helper()
	if err := vm.d.Kill(s.ctx(t), vm.id); err != nil && status.Code(err) != codes.NotFound {
		t.Fatalf("Kill: %s", describe(err))
	}
	if err := vm.d.Delete(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Delete: %s", describe(err))
	}
}
