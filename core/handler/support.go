package handler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// driverCaps is the capabilities of the drivers a sync uses, with their names.
type driverCaps struct {
	hypervisor, network, storage        string
	hypervisorCaps, networkCaps, stCaps *basev1.Capabilities
}

// vmiDevices names, for each of driver.OptionalDevices, the VMI field that asks for it and what it is.
var vmiDevices = map[string]struct{ field, what string }{
	driver.DeviceRNG:                {"spec.domain.devices.rng", "a virtio entropy device"},
	driver.DeviceChassis:            {"spec.domain.chassis", "SMBIOS chassis information"},
	driver.DeviceFeatures:           {"spec.domain.features", "setting platform features"},
	driver.DeviceClock:              {"spec.domain.clock", "setting the clock and timers"},
	driver.DeviceInput:              {"spec.domain.devices.inputs", "an input device (or autoattachInputDevice)"},
	driver.DeviceWatchdog:           {"spec.domain.devices.watchdog", "a watchdog"},
	driver.DeviceCPUFeatures:        {"spec.domain.cpu.features", "turning CPU features on or off"},
	driver.DeviceBIOSSerial:         {"spec.domain.firmware.bootloader.bios.useSerial", "the BIOS's output on the serial console"},
	driver.DeviceSound:              {"spec.domain.devices.sound", "a sound card"},
	driver.DeviceTPM:                {"spec.domain.devices.tpm", "a TPM (swtpm is not installed on the node, or the driver has no TPM)"},
	driver.DeviceHugepages:          {"spec.domain.memory.hugepages", "guest memory on huge pages"},
	driver.DeviceCPUPinning:         {"spec.domain.cpu.dedicatedCpuPlacement", "pinning vCPUs to dedicated host CPUs"},
	driver.DeviceNUMA:               {"spec.domain.cpu.numa.guestMappingPassthrough", "a guest NUMA topology"},
	driver.DeviceLaunchSecurity:     {"spec.domain.launchSecurity", "memory encryption (launchSecurity)"},
	driver.DeviceStartPaused:        {"spec.startStrategy", "starting paused"},
	driver.DeviceNICOptions:         {"spec.domain.devices.interfaces", "an interface's pciAddress, acpiIndex or state"},
	driver.DeviceDiskOptions:        {"spec.domain.devices.disks", "a disk's io, dedicatedIOThread, blockSize, shareable or errorPolicy, or blockMultiQueue"},
	driver.DeviceBalloon:            {"spec.domain.devices.autoattachMemBalloon", "a memory balloon (attached by default: set autoattachMemBalloon: false)"},
	driver.DeviceNICMultiQueue:      {"spec.domain.devices.networkInterfaceMultiqueue", "a virtio interface with a queue pair per vCPU"},
	driver.DeviceVirtioTransitional: {"spec.domain.devices.useVirtioTransitional", "making the virtio devices transitional (legacy and modern)"},
	driver.DeviceLUN:                {"spec.domain.devices.disks", "a lun (SCSI passthrough); checkSupported names each lun disk"},
}

// vmiInterfaceSettings says, for each of driver.OptionalInterfaceSettings, what it is.
var vmiInterfaceSettings = map[string]string{
	driver.InterfaceDHCPOptions: "sending the guest extra DHCP options",
}

// checkSupported reports, by VMI field, what spec (the domain spec the VMI gives, built from
// stand-in driver results) and the plan ask of a driver that the driver does not declare.
func checkSupported(vmi *v1alpha1.VirtualMachineInstance, spec *domainv1.DomainSpec, p *plan, c driverCaps) error {
	var errs fieldErrors
	unsupported := func(field, what, value, kind, name string, have []string) {
		errs.add(field, "%s %q is not supported by the %s driver %q (it supports: %s)", what, value, kind, name, list(have))
	}
	// Firmware.
	fw, field := "bios", "spec.domain.firmware.bootloader"
	switch spec.GetFirmware().GetBoot().(type) {
	case *domainv1.Firmware_Efi:
		fw = "efi"
	case *domainv1.Firmware_Kernel:
		fw, field = "kernel", "spec.domain.firmware.kernelBoot"
	}
	if have := c.hypervisorCaps.GetFirmware(); !slices.Contains(have, fw) {
		unsupported(field, "firmware", fw, "hypervisor", c.hypervisor, have)
	}
	if spec.GetFirmware().GetEfi().GetSecureBoot() && !c.hypervisorCaps.GetSecureBoot() {
		errs.add("spec.domain.firmware.bootloader.efi.secureBoot", "Secure Boot is not supported by the hypervisor driver %q (set secureBoot: false)", c.hypervisor)
	}
	// Persistent state, by the field that asks for it.
	if !c.hypervisorCaps.GetPersistentState() {
		if spec.GetTpm().GetPersistent() {
			errs.add("spec.domain.devices.tpm.persistent", "a persistent TPM is not supported by the hypervisor driver %q (it does not declare Capabilities.persistent_state): drop persistent, and the TPM's state lasts as long as the VMI", c.hypervisor)
		}
		if spec.GetFirmware().GetEfi().GetPersistent() {
			errs.add("spec.domain.firmware.bootloader.efi.persistent", "a persistent EFI variable store is not supported by the hypervisor driver %q (it does not declare Capabilities.persistent_state): drop persistent, and the store lasts as long as the VMI", c.hypervisor)
		}
	}
	// Machine type.
	if t := spec.GetMachine().GetType(); t != "" && !driver.MachineTypeDeclared(c.hypervisorCaps, t) {
		unsupported("spec.domain.machine.type", "machine type", t, "hypervisor", c.hypervisor, c.hypervisorCaps.GetMachineTypes())
	}
	// VNC, attached unless the VMI says otherwise.
	if spec.GetVnc() != nil && !c.hypervisorCaps.GetVnc() {
		errs.add("spec.domain.devices.autoattachGraphicsDevice", "a VNC console is not supported by the hypervisor driver %q (set autoattachGraphicsDevice: false)", c.hypervisor)
	}
	// Optional devices, by the VMI field that asks for each.
	for _, d := range driver.UndeclaredDevices(c.hypervisorCaps, spec) {
		if d.Name == driver.DeviceLUN {
			// By the VMI disk that is a lun.
			for i, disk := range vmi.Spec.Domain.Devices.Disks {
				if disk.LUN != nil {
					errs.add(fmt.Sprintf("spec.domain.devices.disks[%d].lun", i), "a lun (SCSI passthrough) is not supported by the hypervisor driver %q (it offers the devices: %s)", c.hypervisor, list(c.hypervisorCaps.GetDevices()))
				}
			}
			continue
		}
		vmiDev := vmiDevices[d.Name]
		errs.add(vmiDev.field, "%s is not supported by the hypervisor driver %q (it offers the devices: %s)", vmiDev.what, c.hypervisor, list(c.hypervisorCaps.GetDevices()))
	}
	// Disk buses, by the VMI disk (or volume) each domain disk comes from.
	for _, d := range spec.GetDisks() {
		bus := strings.ToLower(strings.TrimPrefix(d.GetBus().String(), "DISK_BUS_"))
		if have := c.hypervisorCaps.GetDiskBuses(); !slices.Contains(have, bus) {
			unsupported(diskField(vmi, d.GetName()), "disk bus", bus, "hypervisor", c.hypervisor, have)
		}
	}
	// NIC models and bindings.
	for i, iface := range vmi.Spec.Domain.Devices.Interfaces {
		field := fmt.Sprintf("spec.domain.devices.interfaces[%d]", i)
		model := iface.Model
		if model == "" {
			model = assemble.DefaultNICModel
		}
		if have := c.hypervisorCaps.GetNicModels(); !slices.Contains(have, model) {
			unsupported(field+".model", "interface model", model, "hypervisor", c.hypervisor, have)
		}
		binding := assemble.Binding(&vmi.Spec.Domain.Devices.Interfaces[i])
		if have := c.networkCaps.GetBindings(); !slices.Contains(have, binding) {
			unsupported(field+"."+binding, "binding", binding, "network", c.network, have)
		}
	}
	// Multi-queue taps, for the queues of networkInterfaceMultiqueue.
	if slices.ContainsFunc(p.interfaces, func(i *networkv1.Interface) bool { return i.GetQueues() > 1 }) && !c.networkCaps.GetMultiQueueTaps() {
		errs.add("spec.domain.devices.networkInterfaceMultiqueue", "multi-queue taps are not supported by the network driver %q (Capabilities.multi_queue_taps)", c.network)
	}
	// Optional interface settings, by the VMI interface that asks for each.
	for i, ni := range p.interfaces {
		for _, o := range driver.UndeclaredInterfaceSettings(c.networkCaps, ni) {
			errs.add(fmt.Sprintf("spec.domain.devices.interfaces[%d].%s", i, o.Field), "%s is not supported by the network driver %q (it offers the interface options: %s)",
				vmiInterfaceSettings[o.Name], c.network, list(c.networkCaps.GetInterfaceOptions()))
		}
	}
	// Probes through the guest agent, which the handler runs with the hypervisor driver.
	for _, pr := range []struct {
		name  string
		probe *v1alpha1.Probe
	}{{"livenessProbe", vmi.Spec.LivenessProbe}, {"readinessProbe", vmi.Spec.ReadinessProbe}} {
		if !pr.probe.UsesGuestAgent() || driver.HasFeature(c.hypervisorCaps, basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC) {
			continue
		}
		check := "exec"
		if pr.probe.GuestAgentPing != nil {
			check = "guestAgentPing"
		}
		errs.add("spec."+pr.name+"."+check, "a probe through the guest agent is not supported by the hypervisor driver %q (it does not declare FEATURE_HYPERVISOR_GUEST_EXEC): use httpGet or tcpSocket", c.hypervisor)
	}
	// Volume types.
	for i, v := range p.volumes {
		typ := volumeType(v)
		if have := c.stCaps.GetVolumeTypes(); !slices.Contains(have, typ) {
			unsupported(fmt.Sprintf("spec.volumes[%d].%s", i, typ), "volume type", typ, "storage", c.storage, have)
		}
	}
	return errs.err()
}

// diskField is the field path of the VMI disk, or else volume, that a domain disk is made from.
func diskField(vmi *v1alpha1.VirtualMachineInstance, name string) string {
	for i, d := range vmi.Spec.Domain.Devices.Disks {
		if d.Name == name {
			if d.CDRom != nil {
				return fmt.Sprintf("spec.domain.devices.disks[%d].cdrom.bus", i)
			}
			if d.LUN != nil {
				return fmt.Sprintf("spec.domain.devices.disks[%d].lun.bus", i)
			}
			return fmt.Sprintf("spec.domain.devices.disks[%d].disk.bus", i)
		}
	}
	for i, v := range vmi.Spec.Volumes {
		if v.Name == name {
			return fmt.Sprintf("spec.volumes[%d]", i)
		}
	}
	return "spec.domain.devices.disks"
}

// volumeType is the name of a volume's source, as in Capabilities.volume_types.
func volumeType(v *storagev1.Volume) string {
	switch v.GetSource().(type) {
	case *storagev1.Volume_ContainerDisk:
		return "containerDisk"
	case *storagev1.Volume_EmptyDisk:
		return "emptyDisk"
	case *storagev1.Volume_HostDisk:
		return "hostDisk"
	case *storagev1.Volume_Ephemeral:
		return "ephemeral"
	case *storagev1.Volume_CloudInitNoCloud:
		return "cloudInitNoCloud"
	case *storagev1.Volume_CloudInitConfigDrive:
		return "cloudInitConfigDrive"
	case *storagev1.Volume_PersistentVolumeClaim:
		return "persistentVolumeClaim"
	}
	return "unknown"
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
