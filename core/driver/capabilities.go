package driver

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// Kind names as they appear in plugin manifests and plugin sets.
const (
	KindHypervisor = "hypervisor"
	KindNetwork    = "network"
	KindStorage    = "storage"
	KindDevice     = "device"
)

// KindName returns the manifest name of a kind ("hypervisor", ...), or "" for an unknown kind.
func KindName(k basev1.Kind) string {
	switch k {
	case basev1.Kind_KIND_HYPERVISOR:
		return KindHypervisor
	case basev1.Kind_KIND_NETWORK:
		return KindNetwork
	case basev1.Kind_KIND_STORAGE:
		return KindStorage
	case basev1.Kind_KIND_DEVICE:
		return KindDevice
	}
	return ""
}

// ParseKind is the inverse of KindName.
func ParseKind(name string) (basev1.Kind, error) {
	for _, k := range []basev1.Kind{basev1.Kind_KIND_HYPERVISOR, basev1.Kind_KIND_NETWORK, basev1.Kind_KIND_STORAGE, basev1.Kind_KIND_DEVICE} {
		if KindName(k) == name {
			return k, nil
		}
	}
	return basev1.Kind_KIND_UNSPECIFIED, fmt.Errorf("unknown driver kind %q (want hypervisor, network, storage or device)", name)
}

// featureImpl says, for each optional feature, which kind it belongs to and whether an
// implementation offers it.
var featureImpl = map[basev1.Feature]struct {
	kind  basev1.Kind
	iface string
	has   func(any) bool
}{
	basev1.Feature_FEATURE_HYPERVISOR_PAUSE:       {basev1.Kind_KIND_HYPERVISOR, "driver.Pauser", is[Pauser]},
	basev1.Feature_FEATURE_HYPERVISOR_REBOOT:      {basev1.Kind_KIND_HYPERVISOR, "driver.Rebooter", is[Rebooter]},
	basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT: {basev1.Kind_KIND_HYPERVISOR, "driver.SoftRebooter", is[SoftRebooter]},
	basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT: {basev1.Kind_KIND_HYPERVISOR, "driver.GuestAgent", is[GuestAgent]},
	basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC:  {basev1.Kind_KIND_HYPERVISOR, "driver.GuestExecer", is[GuestExecer]},
	basev1.Feature_FEATURE_HYPERVISOR_CONSOLE:     {basev1.Kind_KIND_HYPERVISOR, "driver.Consoler", is[Consoler]},
	basev1.Feature_FEATURE_HYPERVISOR_DISPLAY:     {basev1.Kind_KIND_HYPERVISOR, "driver.Displayer", is[Displayer]},
	basev1.Feature_FEATURE_HYPERVISOR_RECOVER:     {basev1.Kind_KIND_HYPERVISOR, "driver.Recoverer", is[Recoverer]},
	basev1.Feature_FEATURE_HYPERVISOR_MIGRATE:     {basev1.Kind_KIND_HYPERVISOR, "driver.Migrator", is[Migrator]},
	basev1.Feature_FEATURE_NETWORK_CHECK:          {basev1.Kind_KIND_NETWORK, "driver.NetworkChecker", is[NetworkChecker]},
	basev1.Feature_FEATURE_DEVICE_WATCH:           {basev1.Kind_KIND_DEVICE, "driver.DeviceWatcher", is[DeviceWatcher]},
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

// CheckCapabilities reports whether impl, a driver of the given kind, implements the optional
// interface of every feature caps declares, and declares no feature of another kind. Serve
// refuses to start a driver that fails it; the conformance kit runs it too.
func CheckCapabilities(kind basev1.Kind, impl any, caps *basev1.Capabilities) error {
	for _, f := range caps.GetFeatures() {
		fi, ok := featureImpl[f]
		switch {
		case !ok:
			return fmt.Errorf("capabilities declare unknown feature %s", f)
		case fi.kind != kind:
			return fmt.Errorf("capabilities declare %s, which is not a feature of a %s driver", f, KindName(kind))
		case !fi.has(impl):
			return fmt.Errorf("capabilities declare %s but the driver does not implement %s", f, fi.iface)
		}
	}
	return nil
}

// HasFeature reports whether caps declares f.
func HasFeature(caps *basev1.Capabilities, f basev1.Feature) bool {
	return slices.Contains(caps.GetFeatures(), f)
}

// optionalFeature is the feature of an optional interface I, if I is one.
func optionalFeature[I any]() (basev1.Feature, bool) {
	switch any((*I)(nil)).(type) {
	case *Pauser:
		return basev1.Feature_FEATURE_HYPERVISOR_PAUSE, true
	case *Rebooter:
		return basev1.Feature_FEATURE_HYPERVISOR_REBOOT, true
	case *SoftRebooter:
		return basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT, true
	case *GuestAgent:
		return basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT, true
	case *GuestExecer:
		return basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC, true
	case *Consoler:
		return basev1.Feature_FEATURE_HYPERVISOR_CONSOLE, true
	case *Displayer:
		return basev1.Feature_FEATURE_HYPERVISOR_DISPLAY, true
	case *Recoverer:
		return basev1.Feature_FEATURE_HYPERVISOR_RECOVER, true
	case *Migrator:
		return basev1.Feature_FEATURE_HYPERVISOR_MIGRATE, true
	case *NetworkChecker:
		return basev1.Feature_FEATURE_NETWORK_CHECK, true
	case *DeviceWatcher:
		return basev1.Feature_FEATURE_DEVICE_WATCH, true
	}
	return basev1.Feature_FEATURE_UNSPECIFIED, false
}

// gated is a host client's side of Optional: the optional interface of feature f, served by the
// driver behind the client. Only the clients of this package implement it.
type gated interface {
	optional(f basev1.Feature) any
}

// Optional returns d as its optional interface I (Pauser, Rebooter, SoftRebooter, GuestAgent,
// GuestExecer, Consoler, Displayer, Recoverer, Migrator, NetworkChecker or DeviceWatcher) when d declares I's
// feature in its Capabilities and offers it, and false otherwise, also when Capabilities fails or I is no optional interface.
//
// It is how the host reaches an optional operation. A host client (HypervisorClient,
// NetworkClient, DeviceClient) does not implement the optional interfaces itself, so a type
// assertion on it for one is false; Optional gives the client's implementation of I exactly when
// the driver behind it declared the feature (the client asks its driver once and caches the
// answer). A Go implementation is given when it declares the feature and implements I: one that
// implements I without declaring it does not offer it.
func Optional[I any](ctx context.Context, d Driver) (I, bool) {
	var zero I
	f, ok := optionalFeature[I]()
	if !ok || d == nil {
		return zero, false
	}
	caps, err := d.Capabilities(ctx)
	if err != nil || !HasFeature(caps, f) {
		return zero, false
	}
	if c, ok := d.(gated); ok {
		i, ok := c.optional(f).(I)
		return i, ok
	}
	i, ok := d.(I)
	return i, ok
}

// CheckDomain reports, as a domain.ValidationError (InvalidArgument) with a field path each, what
// spec asks of a hypervisor driver that caps does not declare: a firmware, Secure Boot, a machine
// type, a disk bus, a NIC model, a VNC console, host devices, tap descriptors, a launcher, an
// optional device (Capabilities.devices). The host runs it before Create (HypervisorClient.Create
// does), so that a driver is never sent what it did not declare. Empty values (no firmware,
// machine type, bus or NIC model: the driver's defaults) pass.
func CheckDomain(caps *basev1.Capabilities, spec *domainv1.DomainSpec) error {
	var errs domain.ValidationError
	add := func(field, format string, args ...any) {
		errs = append(errs, domain.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}
	not := func(what string, have []string) string {
		return fmt.Sprintf("%s is not declared by the driver (Capabilities declares: %s)", what, listOrNone(have))
	}
	fw, field := "", "firmware"
	switch {
	case spec.GetFirmware().GetBios() != nil:
		fw, field = "bios", "firmware.bios"
	case spec.GetFirmware().GetEfi() != nil:
		fw, field = "efi", "firmware.efi"
	case spec.GetFirmware().GetKernel() != nil:
		fw, field = "kernel", "firmware.kernel"
	}
	if fw != "" && !slices.Contains(caps.GetFirmware(), fw) {
		add(field, "%s", not("firmware "+fw, caps.GetFirmware()))
	}
	if spec.GetFirmware().GetEfi().GetSecureBoot() && !caps.GetSecureBoot() {
		add("firmware.efi.secureBoot", "Secure Boot is not declared by the driver (Capabilities.secure_boot)")
	}
	if spec.GetPersistentStateDir() != "" && !caps.GetPersistentState() {
		add("persistentStateDir", "persistent state (tpm.persistent, firmware.efi.persistent) is not declared by the driver (Capabilities.persistent_state)")
	}
	if t := spec.GetMachine().GetType(); t != "" && !MachineTypeDeclared(caps, t) {
		add("machine.type", "%s", not(fmt.Sprintf("machine type %q", t), caps.GetMachineTypes()))
	}
	for i, d := range spec.GetDisks() {
		if d.GetBus() == domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
			continue
		}
		if bus := BusName(d.GetBus()); !slices.Contains(caps.GetDiskBuses(), bus) {
			add(fmt.Sprintf("disks[%d].bus", i), "disk %q: %s", d.GetName(), not("bus "+bus, caps.GetDiskBuses()))
		}
	}
	for i, n := range spec.GetNics() {
		if m := n.GetModel(); m != "" && !slices.Contains(caps.GetNicModels(), m) {
			add(fmt.Sprintf("nics[%d].model", i), "interface %q: %s", n.GetName(), not(fmt.Sprintf("model %q", m), caps.GetNicModels()))
		}
		if n.GetTapFdPath() != "" && !caps.GetTapFd() {
			add(fmt.Sprintf("nics[%d].tapFdPath", i), "interface %q: a tap passed as a descriptor is not declared by the driver (Capabilities.tap_fd)", n.GetName())
		}
	}
	if spec.GetVnc() != nil && !caps.GetVnc() {
		add("vnc", "a VNC console is not declared by the driver (Capabilities.vnc)")
	}
	if len(spec.GetHostDevices()) > 0 && !caps.GetHostDevices() {
		add("hostDevices", "host devices are not declared by the driver (Capabilities.host_devices)")
	}
	for _, d := range UndeclaredDevices(caps, spec) {
		add(d.Field, "%s", not("device "+d.Name, caps.GetDevices()))
	}
	if spec.GetIncomingMigration() != nil && !slices.Contains(caps.GetFeatures(), basev1.Feature_FEATURE_HYPERVISOR_MIGRATE) {
		add("incomingMigration", "live migration is not declared by the driver (FEATURE_HYPERVISOR_MIGRATE)")
	}
	if len(spec.GetIncomingMigration().GetDisks()) > 0 && !caps.GetMigrationDisks() {
		add("incomingMigration.disks", "copying disks in a migration is not declared by the driver (Capabilities.migration_disks)")
	}
	if spec.GetSandbox().GetLauncherSocket() != "" && !caps.GetLauncher() {
		add("sandbox.launcherSocket", "starting the VM through the VMI's launcher is not declared by the driver (Capabilities.launcher)")
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// Optional devices a hypervisor driver declares in Capabilities.devices.
const (
	// DeviceRNG is a virtio entropy device fed from the host's /dev/urandom (DomainSpec.rng).
	DeviceRNG = "rng"
	// DeviceChassis is the SMBIOS chassis information (type 3) of DomainSpec.chassis.
	DeviceChassis = "chassis"
	// DeviceFeatures is the platform features of DomainSpec.features: a driver that declares it
	// honours every field of Features (refusing, with FailedPrecondition, those that need
	// hardware virtualisation when the VM would be emulated).
	DeviceFeatures = "features"
	// DeviceClock is the real-time clock's start and the timers of DomainSpec.clock.
	DeviceClock = "clock"
	// DeviceInput is the tablets and keyboards of DomainSpec.inputs, on usb and virtio.
	DeviceInput = "input"
	// DeviceWatchdog is the i6300esb watchdog of DomainSpec.watchdog with its three actions.
	DeviceWatchdog = "watchdog"
	// DeviceBalloon is the virtio memory balloon of DomainSpec.balloon.
	DeviceBalloon = "balloon"
	// DeviceDiskOptions is the disk options of Disk: io, dedicated_iothread, the block sizes,
	// shareable, error_policy, queues and iothread.
	DeviceDiskOptions = "disk-options"
	// DeviceCPUFeatures is CPU.features: CPUID flags on or off by their policies.
	DeviceCPUFeatures = "cpu-features"
	// DeviceNICOptions is the NIC options of NIC: pci_address, acpi_index and link_down.
	DeviceNICOptions = "nic-options"
	// DeviceStartPaused is DomainSpec.start_paused: Start leaves the VM PAUSED.
	DeviceStartPaused = "start-paused"
	// DeviceSound is the sound card of DomainSpec.sound (ich9 or ac97).
	DeviceSound = "sound"
	// DeviceTPM is the TPM 2.0 of DomainSpec.tpm: an emulator (swtpm) in the VM's sandbox,
	// with its state in run_dir for the VM's life. A driver declares it only where the
	// emulator is installed.
	DeviceTPM = "tpm"
	// DeviceLaunchSecurity is DomainSpec.launch_security: memory encryption by the host CPU (AMD
	// SEV), with every virtio device behind the platform IOMMU.
	DeviceLaunchSecurity = "launch-security"
	// DeviceBIOSSerial is BIOS.use_serial: the BIOS's output on the serial console.
	DeviceBIOSSerial = "bios-serial"
	// DeviceHugepages is Memory.hugepages: the guest RAM in a file on the hugetlbfs at its path.
	DeviceHugepages = "hugepages"
	// DeviceCPUPinning is CPU.pinning: each vCPU's thread on its host CPU, and the VM process's
	// other threads on the emulator CPUs when there are some, before the guest runs.
	DeviceCPUPinning = "cpu-pinning"
	// DeviceNUMA is CPU.numa_cells: guest NUMA nodes of those vCPUs and memory, bound to the
	// host NUMA nodes given.
	DeviceNUMA = "numa"
	// DeviceNICMultiQueue is NIC.queues: a virtio NIC with that many queue pairs on a
	// multi-queue tap.
	DeviceNICMultiQueue = "nic-multiqueue"
	// DeviceVirtioTransitional is DomainSpec.virtio_transitional: transitional (legacy and
	// modern) virtio devices. Without it a driver still gives modern-only ones.
	DeviceVirtioTransitional = "virtio-transitional"
	// DeviceLUN is a Disk of device DISK_DEVICE_LUN: SCSI passthrough of the block device at its
	// path (SG_IO), on bus scsi. A driver declaring it refuses, before it starts the VM, a path
	// that is not a device taking SG_IO, naming the disk and the path.
	DeviceLUN = "lun"
)

// OptionalDevice is an optional device of the domain spec: its name in Capabilities.devices, the
// domain spec field that asks for it, and whether a spec does.
type OptionalDevice struct {
	Name, Field string
	asked       func(*domainv1.DomainSpec) bool
}

// OptionalDevices are the optional devices of the domain spec. Adding one is an entry here (and
// its constant): CheckDomain and the node handler's checks both read this list.
var OptionalDevices = []OptionalDevice{
	{Name: DeviceRNG, Field: "rng", asked: func(s *domainv1.DomainSpec) bool { return s.GetRng() != nil }},
	{Name: DeviceChassis, Field: "chassis", asked: func(s *domainv1.DomainSpec) bool { return s.GetChassis() != nil }},
	{Name: DeviceFeatures, Field: "features", asked: func(s *domainv1.DomainSpec) bool { return s.GetFeatures() != nil }},
	{Name: DeviceClock, Field: "clock", asked: func(s *domainv1.DomainSpec) bool { return s.GetClock() != nil }},
	{Name: DeviceInput, Field: "inputs", asked: func(s *domainv1.DomainSpec) bool { return len(s.GetInputs()) > 0 }},
	{Name: DeviceWatchdog, Field: "watchdog", asked: func(s *domainv1.DomainSpec) bool { return s.GetWatchdog() != nil }},
	{Name: DeviceBalloon, Field: "balloon", asked: func(s *domainv1.DomainSpec) bool { return s.GetBalloon() != nil }},
	{Name: DeviceCPUFeatures, Field: "cpu.features", asked: func(s *domainv1.DomainSpec) bool { return len(s.GetCpu().GetFeatures()) > 0 }},
	{Name: DeviceBIOSSerial, Field: "firmware.bios.useSerial", asked: func(s *domainv1.DomainSpec) bool { return s.GetFirmware().GetBios().GetUseSerial() }},
	{Name: DeviceSound, Field: "sound", asked: func(s *domainv1.DomainSpec) bool { return s.GetSound() != nil }},
	{Name: DeviceTPM, Field: "tpm", asked: func(s *domainv1.DomainSpec) bool { return s.GetTpm() != nil }},
	{Name: DeviceLaunchSecurity, Field: "launchSecurity", asked: func(s *domainv1.DomainSpec) bool { return s.GetLaunchSecurity() != nil }},
	{Name: DeviceHugepages, Field: "memory.hugepages", asked: func(s *domainv1.DomainSpec) bool { return s.GetMemory().GetHugepages() != nil }},
	{Name: DeviceCPUPinning, Field: "cpu.pinning", asked: func(s *domainv1.DomainSpec) bool { return s.GetCpu().GetPinning() != nil }},
	{Name: DeviceNUMA, Field: "cpu.numaCells", asked: func(s *domainv1.DomainSpec) bool { return len(s.GetCpu().GetNumaCells()) > 0 }},
	{Name: DeviceStartPaused, Field: "startPaused", asked: func(s *domainv1.DomainSpec) bool { return s.GetStartPaused() }},
	{Name: DeviceNICOptions, Field: "nics", asked: func(s *domainv1.DomainSpec) bool {
		return slices.ContainsFunc(s.GetNics(), func(n *domainv1.NIC) bool {
			return n.GetPciAddress() != "" || n.GetAcpiIndex() != 0 || n.GetLinkDown()
		})
	}},
	{Name: DeviceNICMultiQueue, Field: "nics", asked: func(s *domainv1.DomainSpec) bool {
		return slices.ContainsFunc(s.GetNics(), func(n *domainv1.NIC) bool { return n.GetQueues() > 1 })
	}},
	{Name: DeviceVirtioTransitional, Field: "virtioTransitional", asked: func(s *domainv1.DomainSpec) bool { return s.GetVirtioTransitional() }},
	{Name: DeviceLUN, Field: "disks", asked: func(s *domainv1.DomainSpec) bool {
		return slices.ContainsFunc(s.GetDisks(), func(d *domainv1.Disk) bool { return d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN })
	}},
	{Name: DeviceDiskOptions, Field: "disks", asked: func(s *domainv1.DomainSpec) bool {
		return slices.ContainsFunc(s.GetDisks(), func(d *domainv1.Disk) bool {
			return d.GetIo() != "" || d.GetDedicatedIothread() || d.GetLogicalBlockSize() != 0 || d.GetPhysicalBlockSize() != 0 ||
				d.GetShareable() || d.GetErrorPolicy() != "" || d.GetQueues() != 0 || d.GetIothread() != ""
		})
	}},
}

// UndeclaredDevices returns the optional devices spec asks for that caps does not declare.
func UndeclaredDevices(caps *basev1.Capabilities, spec *domainv1.DomainSpec) []OptionalDevice {
	var out []OptionalDevice
	for _, d := range OptionalDevices {
		if d.asked(spec) && !slices.Contains(caps.GetDevices(), d.Name) {
			out = append(out, d)
		}
	}
	return out
}

// Optional interface settings a network driver declares in Capabilities.interface_options.
const (
	// InterfaceDHCPOptions is Interface.dhcp_options: the driver's DHCP server sends them to the
	// interface's guest.
	InterfaceDHCPOptions = "dhcp-options"
)

// OptionalInterfaceSetting is an optional setting of a network Interface: its name in
// Capabilities.interface_options, the Interface field that asks for it, and whether an
// interface does.
type OptionalInterfaceSetting struct {
	Name, Field string
	asked       func(*networkv1.Interface) bool
}

// OptionalInterfaceSettings are the optional settings of a network Interface. Adding one is an
// entry here (and its constant): CheckSetup and the node handler's checks both read this list.
var OptionalInterfaceSettings = []OptionalInterfaceSetting{
	{Name: InterfaceDHCPOptions, Field: "dhcpOptions", asked: func(i *networkv1.Interface) bool { return i.GetDhcpOptions() != nil }},
}

// UndeclaredInterfaceSettings returns the optional settings iface asks for that caps does not
// declare.
func UndeclaredInterfaceSettings(caps *basev1.Capabilities, iface *networkv1.Interface) []OptionalInterfaceSetting {
	var out []OptionalInterfaceSetting
	for _, o := range OptionalInterfaceSettings {
		if o.asked(iface) && !slices.Contains(caps.GetInterfaceOptions(), o.Name) {
			out = append(out, o)
		}
	}
	return out
}

// CheckSetup reports, as InvalidArgument with a field path each, what req asks of a network
// driver that caps does not declare: an optional interface setting (Capabilities.
// interface_options). The host's network client runs it before Setup, so that a driver is
// never sent what it did not declare. Bindings are the driver's to refuse (Setup's contract).
func CheckSetup(caps *basev1.Capabilities, req *networkv1.SetupRequest) error {
	var errs []string
	for i, iface := range req.GetInterfaces() {
		for _, o := range UndeclaredInterfaceSettings(caps, iface) {
			errs = append(errs, fmt.Sprintf("interfaces[%d].%s: interface %q: %s is not declared by the driver (Capabilities.interface_options declares: %s)",
				i, o.Field, iface.GetName(), o.Name, listOrNone(caps.GetInterfaceOptions())))
		}
	}
	if len(errs) > 0 {
		return status.Error(codes.InvalidArgument, strings.Join(errs, "; "))
	}
	return nil
}

// MachineTypeDeclared reports whether caps declares machine type t: listed, or matched by an
// entry ending in "*" as a prefix.
func MachineTypeDeclared(caps *basev1.Capabilities, t string) bool {
	for _, m := range caps.GetMachineTypes() {
		if m == t {
			return true
		}
		if p, ok := strings.CutSuffix(m, "*"); ok && strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// BusName is a disk bus as Capabilities.disk_buses names it ("virtio", "sata", ...).
func BusName(b domainv1.DiskBus) string {
	return strings.ToLower(strings.TrimPrefix(b.String(), "DISK_BUS_"))
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
