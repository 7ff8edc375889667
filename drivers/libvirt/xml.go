package libvirt

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// What the driver offers (Capabilities) and BuildDomain accepts.
var (
	supportedFirmware  = []string{"bios", "efi", "kernel"}
	supportedDiskBuses = []string{"virtio", "sata", "scsi"}
	supportedNICModels = []string{"virtio", "e1000", "e1000e", "rtl8139"}
	// supportedMachineTypes are the machine types machineRE accepts; libvirt checks a versioned
	// one against what its QEMU offers when the domain starts.
	supportedMachineTypes = []string{"q35", "pc", "pc-q35-*", "pc-i440fx-*"}
	supportedDevices      = []string{driver.DeviceRNG, driver.DeviceBalloon, driver.DeviceChassis, driver.DeviceFeatures,
		driver.DeviceClock, driver.DeviceInput, driver.DeviceWatchdog, driver.DeviceSound, driver.DeviceCPUFeatures,
		driver.DeviceVirtioTransitional, driver.DeviceCPUPinning, driver.DeviceStartPaused,
		driver.DeviceDiskOptions, driver.DeviceNUMA, driver.DeviceNICOptions, driver.DeviceNICMultiQueue}
)

// maxNICQueues is the most queues a Linux tap has (MAX_TAP_QUEUES).
const maxNICQueues = 256

var (
	machineRE = regexp.MustCompile(`^(q35|pc|pc-q35-[0-9.]+|pc-i440fx-[0-9.]+)$`)
	pciRE     = regexp.MustCompile(`^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$`)
	cacheRE   = regexp.MustCompile(`^(|none|writethrough|writeback)$`)
)

// Env is what BuildDomain needs to know of the node and of where the VM's files go.
type Env struct {
	// Accel is the accelerator the VM runs with: qmp.AccelKVM (domain type kvm) or qmp.AccelTCG
	// (domain type qemu).
	Accel qmp.Accel
	// Emulator is the QEMU binary, as the per-VMI daemon sees it.
	Emulator string
	// OVMF are the UEFI firmware files; empty paths mean that build is not installed.
	OVMF qmp.OVMF
	// NVRAM is where the VM's EFI variable store goes (copied by libvirt from the template).
	NVRAM string
	// Serial is the serial port's socket: the spec's, or the driver's own in the run dir.
	Serial string
	// Now is the time the clock's start is worked out at (clock.timezone); nil is time.Now.
	Now func() time.Time
	// AgentSocket is the guest agent channel's socket; empty leaves the channel out.
	AgentSocket string
	// SWTPMProblem, when set, is why the daemon cannot run an emulated TPM (tpm) on this node.
	SWTPMProblem string
}

// BuildDomain maps a driver-neutral domain spec to libvirt's domain XML. It is pure: the same
// spec and Env give the same domain. A field of the spec it cannot honour is an error naming the
// field (domain.ValidationError), never dropped; what the driver does not declare in its
// Capabilities the host does not send, and BuildDomain refuses it anyway.
//
// The domain is transient (created and started at once by the per-VMI daemon), named after the
// spec's id, and has only the devices the spec asks for: libvirt's defaults that the spec did
// not ask for (a memory balloon, a USB controller) are turned off. Devices libvirt always gives
// a guest of the machine type (the PS/2 keyboard and mouse of pc and q35, a video card with VNC)
// are what QEMU gives it under the qmp driver too.
func BuildDomain(spec *domainv1.DomainSpec, env Env) (*libvirtxml.Domain, error) {
	d, _, err := BuildDomainOrigins(spec, env)
	return d, err
}

// BuildDomainOrigins is BuildDomain that also returns its record of which field of the spec
// each part of the domain came from (Origins): Start places libvirt's refusal of the domain
// with it.
func BuildDomainOrigins(spec *domainv1.DomainSpec, env Env) (*libvirtxml.Domain, *Origins, error) {
	b := &builder{spec: spec, env: env, org: newOrigins()}
	d := b.build()
	if len(b.errs) > 0 {
		return nil, nil, b.errs
	}
	if b.missing != "" {
		return nil, nil, status.Error(codes.FailedPrecondition, b.missing)
	}
	return d, b.org, nil
}

type builder struct {
	spec    *domainv1.DomainSpec
	env     Env
	errs    domain.ValidationError
	missing string // a host precondition that does not hold
	// iothreads are the domain's I/O threads (libvirt numbers them from 1): a disk's own, or
	// a pool thread by its spec name.
	iothreads map[string]uint
	// org records which spec field each part of the domain came from.
	org *Origins
}

func (b *builder) fail(field, format string, args ...any) {
	b.errs = append(b.errs, domain.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

func (b *builder) build() *libvirtxml.Domain {
	s := b.spec
	b.refuseUnsupported()
	typ := "qemu"
	if b.env.Accel == qmp.AccelKVM {
		typ = "kvm"
	}
	machine := s.GetMachine().GetType()
	if machine == "" {
		machine = "q35"
	}
	if !machineRE.MatchString(machine) {
		b.fail("machine.type", "%q is not supported (%s)", machine, strings.Join(supportedMachineTypes, ", "))
	}
	b.org.add("os/type@machine", "machine.type", machine)
	b.org.add("memory", "memory.guestBytes", "")
	d := &libvirtxml.Domain{
		Type: typ,
		Name: DomainName,
		UUID: domainUUID(s),
		Memory: &libvirtxml.DomainMemory{
			Value: uint(s.GetMemory().GetGuestBytes() >> 10), Unit: "KiB",
		},
		OS:         &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: machine, Type: "hvm"}},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices:    &libvirtxml.DomainDeviceList{Emulator: b.env.Emulator},
	}
	if s.GetName() != "" {
		d.Title = s.GetName()
	}
	if s.GetMemory().GetGuestBytes()%(1<<10) != 0 {
		b.fail("memory.guestBytes", "%d is not a multiple of 1 KiB", s.GetMemory().GetGuestBytes())
	}
	b.cpu(d)
	b.firmware(d)
	b.features(d)
	b.clock(d)
	b.chassis(d)
	b.disks(d)
	d.IOThreads = uint(len(b.iothreads))
	b.nics(d)
	b.consoles(d)
	b.hostDevices(d)
	b.hostDeviceOrigins()
	usb := b.inputs(d)
	b.watchdog(d)
	b.sound(d)
	b.tpm(d)
	b.agentChannel(d)
	b.pinning(d)
	b.checkPersistentStateDir()
	dev := d.Devices
	// libvirt adds a USB controller and a memory balloon unless told not to.
	usbModel := "none"
	if usb {
		usbModel = "qemu-xhci"
	}
	dev.Controllers = append(dev.Controllers, libvirtxml.DomainController{Type: "usb", Model: usbModel})
	if s.GetBalloon() != nil {
		dev.MemBalloon = &libvirtxml.DomainMemBalloon{Model: b.virtioModel()}
		b.org.add("devices/memballoon", "balloon", "")
	} else {
		dev.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "none"}
	}
	if s.GetRng() != nil {
		dev.RNGs = append(dev.RNGs, libvirtxml.DomainRNG{
			Model:   b.virtioModel(),
			Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
		})
		b.org.add("devices/rng", "rng", "")
	}
	return d
}

// virtioModel is the model of a virtio device that is not a disk or NIC (balloon, rng).
func (b *builder) virtioModel() string {
	if b.spec.GetVirtioTransitional() {
		return "virtio-transitional"
	}
	return "virtio-non-transitional"
}

// refuseUnsupported names every field of the spec this driver does not implement.
func (b *builder) refuseUnsupported() {
	s := b.spec
	for _, f := range []struct {
		set   bool
		field string
	}{
		{s.GetLaunchSecurity() != nil, "launchSecurity"},
		{s.GetMemory().GetHugepages() != nil, "memory.hugepages"},
		{s.GetFirmware().GetBios().GetUseSerial(), "firmware.bios.useSerial"},
	} {
		if f.set {
			b.fail(f.field, "not supported by the libvirt driver")
		}
	}
}

func (b *builder) cpu(d *libvirtxml.Domain) {
	c := b.spec.GetCpu()
	sockets, cores, threads := max(c.GetSockets(), 1), max(c.GetCores(), 1), max(c.GetThreads(), 1)
	d.VCPU = &libvirtxml.DomainVCPU{Value: uint(sockets * cores * threads)}
	b.org.add("vcpu", "cpu", strconv.FormatUint(uint64(sockets*cores*threads), 10))
	b.org.add("cpu/topology", "cpu", "")
	cpu := &libvirtxml.DomainCPU{
		Topology: &libvirtxml.DomainCPUTopology{Sockets: int(sockets), Cores: int(cores), Threads: int(threads)},
	}
	switch m := c.GetModel(); {
	case m == "host-passthrough" || m == "host-model":
		if b.env.Accel != qmp.AccelKVM {
			b.fail("cpu.model", "%s needs hardware acceleration, which this VM runs without", m)
		}
		cpu.Mode = m
		b.org.add("cpu@mode", "cpu.model", m)
	case m == "":
		// libvirt's default model for the domain type: qemu64 under TCG, as with qmp.
	default:
		cpu.Mode = "custom"
		cpu.Match = "exact"
		cpu.Model = &libvirtxml.DomainCPUModel{Value: m, Fallback: "forbid"}
		b.org.add("cpu/model", "cpu.model", m)
	}
	b.cpuFeatures(cpu)
	b.numa(cpu, d)
	d.CPU = cpu
}

func (b *builder) firmware(d *libvirtxml.Domain) {
	fw := b.spec.GetFirmware()
	os := d.OS
	switch {
	case fw.GetKernel() != nil:
		k := fw.GetKernel()
		os.Kernel, os.Initrd, os.Cmdline = k.GetKernelPath(), k.GetInitrdPath(), k.GetCmdline()
		b.org.device("os/kernel", "firmware.kernel.kernelPath", "", k.GetKernelPath())
		if k.GetInitrdPath() != "" {
			b.org.device("os/initrd", "firmware.kernel.initrdPath", "", k.GetInitrdPath())
		}
		b.org.add("os/cmdline", "firmware.kernel.cmdline", "")
	case fw.GetEfi() != nil:
		code, vars := b.env.OVMF.Code, b.env.OVMF.Vars
		secure := fw.GetEfi().GetSecureBoot()
		if secure {
			code, vars = b.env.OVMF.SecureCode, b.env.OVMF.SecureVars
		}
		if code == "" || vars == "" {
			what := "UEFI firmware (OVMF)"
			if secure {
				what = "the Secure Boot build of OVMF"
			}
			b.fail("firmware.efi", "%s is not installed on this node", what)
			return
		}
		os.Loader = &libvirtxml.DomainLoader{Path: code, Readonly: "yes", Type: "pflash"}
		os.NVRam = &libvirtxml.DomainNVRam{NVRam: b.nvram(), Template: vars}
		b.org.device("os/loader", "firmware.efi", "", code)
		b.org.device("os/nvram", "firmware.efi", "", vars)
		if secure {
			// Secure Boot's firmware runs its variable store in SMM, which q35 alone offers.
			os.Loader.Secure = "yes"
			d.Features.SMM = &libvirtxml.DomainFeatureSMM{State: "on"}
			if m := os.Type.Machine; !strings.Contains(m, "q35") {
				b.fail("firmware.efi.secureBoot", "needs machine type q35, not %q", m)
			}
		}
	}
	if serial := fw.GetSerial(); serial != "" || b.spec.GetUuid() != "" {
		d.SysInfo = []libvirtxml.DomainSysInfo{{SMBIOS: &libvirtxml.DomainSysInfoSMBIOS{
			System: &libvirtxml.DomainSysInfoSystem{Entry: sysEntries(serial, b.spec.GetUuid())},
		}}}
		os.SMBios = &libvirtxml.DomainSMBios{Mode: "sysinfo"}
		b.org.add("sysinfo/system", "firmware.serial", "")
	}
}

func sysEntries(serial, uuid string) []libvirtxml.DomainSysInfoEntry {
	var e []libvirtxml.DomainSysInfoEntry
	if serial != "" {
		e = append(e, libvirtxml.DomainSysInfoEntry{Name: "serial", Value: serial})
	}
	if uuid != "" {
		e = append(e, libvirtxml.DomainSysInfoEntry{Name: "uuid", Value: uuid})
	}
	return e
}

// diskPrefix is the guest device name prefix libvirt wants per bus.
var diskPrefix = map[domainv1.DiskBus]string{
	domainv1.DiskBus_DISK_BUS_VIRTIO: "vd", domainv1.DiskBus_DISK_BUS_SATA: "sd", domainv1.DiskBus_DISK_BUS_SCSI: "sd",
}

func (b *builder) disks(d *libvirtxml.Domain) {
	next := map[string]int{}
	scsi := false
	for i, disk := range b.spec.GetDisks() {
		f := fmt.Sprintf("disks[%d]", i)
		bus := disk.GetBus()
		if bus == domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
			bus = domainv1.DiskBus_DISK_BUS_VIRTIO
		}
		prefix, ok := diskPrefix[bus]
		if !ok {
			b.fail(f+".bus", "%s is not supported (%s)", busName(bus), strings.Join(supportedDiskBuses, ", "))
			continue
		}
		if disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN {
			b.fail(f+".device", "lun is not supported by the libvirt driver")
			continue
		}
		if !cacheRE.MatchString(disk.GetCache()) {
			b.fail(f+".cache", "%q is not none, writethrough or writeback", disk.GetCache())
		}
		// sata and scsi share the sd names, as their guests' kernels name them.
		dev := prefix + driveLetters(next[prefix])
		next[prefix]++
		format := "raw"
		if disk.GetFormat() == domainv1.DiskFormat_DISK_FORMAT_QCOW2 {
			format = "qcow2"
		}
		x := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format, Cache: disk.GetCache()},
			Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: busName(bus)},
			Serial: disk.GetSerial(),
			Alias:  &libvirtxml.DomainAlias{Name: "ua-disk-" + alias(disk.GetName())},
		}
		b.diskOrigins(f, disk, &x)
		b.diskOptions(f, disk, bus, &x)
		if disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_CDROM {
			x.Device = "cdrom"
			x.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
			if bus == domainv1.DiskBus_DISK_BUS_VIRTIO {
				b.fail(f+".bus", "a cdrom cannot be on virtio (sata or scsi)")
			}
		}
		if bus == domainv1.DiskBus_DISK_BUS_VIRTIO && b.spec.GetVirtioTransitional() {
			x.Model = "virtio-transitional"
		} else if bus == domainv1.DiskBus_DISK_BUS_VIRTIO {
			x.Model = "virtio-non-transitional"
		}
		if bus == domainv1.DiskBus_DISK_BUS_SCSI {
			scsi = true
		}
		if disk.GetReadOnly() {
			x.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		if disk.GetBootOrder() > 0 {
			x.Boot = &libvirtxml.DomainDeviceBoot{Order: uint(disk.GetBootOrder())}
		}
		if x.Boot != nil {
			b.org.add(diskLoc(&x)+"/boot", f+".bootOrder", "")
		}
		if isBlockDevice(disk.GetPath()) {
			x.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: disk.GetPath()}}
		} else {
			x.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: disk.GetPath()}}
		}
		d.Devices.Disks = append(d.Devices.Disks, x)
	}
	if scsi {
		model := "virtio-non-transitional"
		if b.spec.GetVirtioTransitional() {
			model = "virtio-transitional"
		}
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "scsi", Model: model})
		b.org.add("devices/controller[scsi]", "disks", "")
	}
}

func busName(b domainv1.DiskBus) string {
	return strings.ToLower(strings.TrimPrefix(b.String(), "DISK_BUS_"))
}

// driveLetters is libvirt's disk suffix for index n: a..z, aa..az, ...
func driveLetters(n int) string {
	s := ""
	for n++; n > 0; n = (n - 1) / 26 {
		s = string(rune('a'+(n-1)%26)) + s
	}
	return s
}

// alias makes a VMI device name usable in a libvirt user alias ([a-zA-Z0-9_-]).
func alias(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, name)
}

func (b *builder) nics(d *libvirtxml.Domain) {
	for i, n := range b.spec.GetNics() {
		f := fmt.Sprintf("nics[%d]", i)
		if n.GetTapFdPath() != "" {
			b.fail(f+".tapFdPath", "the libvirt driver opens its taps by name (tapName), it takes no descriptor")
			continue
		}
		model := n.GetModel()
		if model == "" {
			model = "virtio"
		}
		if !contains(supportedNICModels, model) {
			b.fail(f+".model", "%q is not supported (%s)", model, strings.Join(supportedNICModels, ", "))
		}
		queues := n.GetQueues()
		if queues > 1 {
			switch {
			case model != "virtio":
				b.fail(f+".queues", "only a virtio NIC has more than one queue, not %q", model)
			case queues > maxNICQueues:
				b.fail(f+".queues", "%d is more than a tap has (%d)", queues, maxNICQueues)
			}
		}
		if model == "virtio" {
			model = "virtio-non-transitional"
			if b.spec.GetVirtioTransitional() {
				model = "virtio-transitional"
			}
		}
		x := libvirtxml.DomainInterface{
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: n.GetMac()},
			Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
			// The network driver made the tap: libvirt must neither make nor remove it.
			Target: &libvirtxml.DomainInterfaceTarget{Dev: n.GetTapName(), Managed: "no"},
			Model:  &libvirtxml.DomainInterfaceModel{Type: model},
			Alias:  &libvirtxml.DomainAlias{Name: "ua-net-" + alias(n.GetName())},
		}
		if queues > 1 {
			// libvirt opens the network driver's multi-queue tap once per queue pair and gives
			// the device its vectors (2q+2).
			x.Driver = &libvirtxml.DomainInterfaceDriver{Queues: uint(queues)}
		}
		if n.GetMtu() > 0 {
			x.MTU = &libvirtxml.DomainInterfaceMTU{Size: uint(n.GetMtu())}
		}
		if n.GetBootOrder() > 0 {
			x.Boot = &libvirtxml.DomainDeviceBoot{Order: uint(n.GetBootOrder())}
		}
		if n.GetLinkDown() {
			x.Link = &libvirtxml.DomainInterfaceLink{State: "down"}
		}
		if n.GetAcpiIndex() > 0 {
			x.ACPI = &libvirtxml.DomainDeviceACPI{Index: uint(n.GetAcpiIndex())}
		}
		if a := n.GetPciAddress(); a != "" {
			pci, err := pciAddress(a)
			if err != nil {
				b.fail(f+".pciAddress", "%v", err)
			} else {
				x.Address = &libvirtxml.DomainAddress{PCI: pci}
			}
		}
		b.nicOrigins(f, n, &x)
		d.Devices.Interfaces = append(d.Devices.Interfaces, x)
	}
}

func (b *builder) consoles(d *libvirtxml.Domain) {
	if p := b.env.Serial; p != "" {
		port := uint(0)
		d.Devices.Serials = append(d.Devices.Serials, libvirtxml.DomainSerial{
			Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: p}},
			Target: &libvirtxml.DomainSerialTarget{Port: &port},
		})
		field := "serial.socketPath"
		if b.spec.GetSerial().GetSocketPath() == "" {
			field = "runDir" // the driver's own socket in the run dir
		}
		b.org.device("devices/serial", field, "", p)
	}
	if p := b.spec.GetVnc().GetSocketPath(); p != "" {
		d.Devices.Graphics = append(d.Devices.Graphics, libvirtxml.DomainGraphic{VNC: &libvirtxml.DomainGraphicVNC{Socket: p}})
		b.org.device("devices/graphics", "vnc.socketPath", "", p)
	}
}

func (b *builder) hostDevices(d *libvirtxml.Domain) {
	b.errs = append(b.errs, domain.NonPCIHostDevices(b.spec)...)
	for i, h := range b.spec.GetHostDevices() {
		if h.GetPciAddress() == "" {
			continue // refused above
		}
		pci, err := pciAddress(h.GetPciAddress())
		if err != nil {
			b.fail(fmt.Sprintf("hostDevices[%d].pciAddress", i), "%v", err)
			continue
		}
		// managed no: the device driver bound the function to vfio-pci; libvirt must not
		// rebind it (it could not, unprivileged).
		d.Devices.Hostdevs = append(d.Devices.Hostdevs, libvirtxml.DomainHostdev{
			Managed:   "no",
			SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: pci}},
			Alias:     &libvirtxml.DomainAlias{Name: "ua-hostdev-" + alias(h.GetName())},
		})
	}
}

// pciAddress parses "0000:01:00.0".
func pciAddress(s string) (*libvirtxml.DomainAddressPCI, error) {
	m := pciRE.FindStringSubmatch(s)
	if m == nil {
		return nil, fmt.Errorf("%q is not a PCI address (dddd:bb:ss.f)", s)
	}
	var v [4]uint
	for i := range v {
		n, _ := strconv.ParseUint(m[i+1], 16, 32)
		v[i] = uint(n)
	}
	return &libvirtxml.DomainAddressPCI{Domain: &v[0], Bus: &v[1], Slot: &v[2], Function: &v[3]}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
