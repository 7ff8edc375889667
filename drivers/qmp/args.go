package qmp

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// Accel is a QEMU accelerator.
type Accel string

// The accelerators the driver uses.
const (
	AccelKVM Accel = "kvm"
	AccelTCG Accel = "tcg"
)

// OVMF names the UEFI firmware files: code (read-only) and the template of the variable store
// each VM gets a copy of, plain and with Secure Boot (Microsoft keys enrolled, SMM required).
type OVMF struct {
	Code       string `json:"code,omitempty"`
	Vars       string `json:"vars,omitempty"`
	SecureCode string `json:"secureCode,omitempty"`
	SecureVars string `json:"secureVars,omitempty"`
}

// DefaultOVMF is where Debian's ovmf package installs the 4 MiB firmware.
var DefaultOVMF = OVMF{
	Code:       "/usr/share/OVMF/OVMF_CODE_4M.fd",
	Vars:       "/usr/share/OVMF/OVMF_VARS_4M.fd",
	SecureCode: "/usr/share/OVMF/OVMF_CODE_4M.ms.fd",
	SecureVars: "/usr/share/OVMF/OVMF_VARS_4M.ms.fd",
}

// HostEnv is what BuildArgs needs to know about the node.
type HostEnv struct {
	// Accel is the accelerator the VM runs with.
	Accel Accel
	// RunDir is the VM's directory for sockets, the pidfile, the log and the EFI variables.
	RunDir string
	// OVMF is the UEFI firmware; an empty Code (or SecureCode) means it is not installed.
	OVMF OVMF
	// VhostNet says /dev/vhost-net is usable: virtio NICs then get vhost=on.
	VhostNet bool
	// CPUModels and MachineTypes are what this QEMU offers (`-cpu help`, `-machine help`);
	// nil skips the check.
	CPUModels    []string
	MachineTypes []string
	// CPUFlags are the CPUID flags this QEMU knows (`-cpu help`'s "Recognized CPUID flags");
	// nil skips the check.
	CPUFlags []string
	// BlockDevices are the disk paths that are block devices rather than files.
	BlockDevices map[string]bool
	// SGIO says, for the path of each lun disk, why it is not a device that takes SCSI commands
	// (SG_IO), or "" when it is one (see sgioProblem). A lun whose path is not in it is refused.
	SGIO map[string]string
	// SEV is what the host offers for AMD SEV guests, nil when nothing; SEVReason says why not.
	SEV       *SEVHost
	SEVReason string
	// SWTPM is the swtpm binary, empty when it is not usable; SWTPMReason says why.
	SWTPM       string
	SWTPMReason string
	// TCGTranslationCacheMiB is QEMU's tb-size for an emulated VM; 0 leaves QEMU's default.
	TCGTranslationCacheMiB int
	// Now is the time the real-time clock's start is worked out from (clock offsets and time
	// zones); nil is time.Now.
	Now func() time.Time
}

// Cmdline is one QEMU invocation.
type Cmdline struct {
	// Args are QEMU's arguments, without the binary.
	Args []string
	// ExtraFiles are paths the launcher opens and passes to QEMU: the i-th becomes fd 3+i.
	ExtraFiles []string
	// VarsTemplate, when set, is copied to Paths.Vars before the first start (of the first VM
	// given the persistent state directory, for a persistent EFI variable store).
	VarsTemplate string
	// TPM, when set, is the swtpm to start with QEMU, joined to it by a socketpair.
	TPM *TPMCmd
}

// Paths are the files the driver keeps in a VM's run dir, and in its persistent state
// directory what the spec asks to keep there (Vars, TPMState).
type Paths struct {
	QMP    string
	Serial string
	PID    string
	Log    string
	Vars   string
	// Agent is the host side of the guest agent's virtio-serial port (AgentPort).
	Agent string
	// TPMState is swtpm's state directory and SWTPMLog its log.
	TPMState string
	SWTPMLog string
}

// RunPaths returns the paths of a VM's files in runDir. The serial socket is the spec's when it
// names one; the TPM's state and the EFI variable store are in the spec's persistent state
// directory when it asks to keep them (PersistentTPMDir, PersistentVarsFile).
func RunPaths(spec *domainv1.DomainSpec, runDir string) Paths {
	p := Paths{
		QMP:    filepath.Join(runDir, "qmp.sock"),
		Serial: filepath.Join(runDir, "serial.sock"),
		PID:    filepath.Join(runDir, "qemu.pid"),
		Log:    filepath.Join(runDir, "qemu.log"),
		Vars:   filepath.Join(runDir, "OVMF_VARS.fd"),
		Agent:  filepath.Join(runDir, "qga.sock"),
		// The TPM's state directory and swtpm's log.
		TPMState: filepath.Join(runDir, "tpm"),
		SWTPMLog: filepath.Join(runDir, "swtpm.log"),
	}
	if s := spec.GetSerial().GetSocketPath(); s != "" {
		p.Serial = s
	}
	if dir := spec.GetPersistentStateDir(); dir != "" {
		if spec.GetTpm().GetPersistent() {
			p.TPMState = filepath.Join(dir, PersistentTPMDir)
		}
		if spec.GetFirmware().GetEfi().GetPersistent() {
			p.Vars = filepath.Join(dir, PersistentVarsFile)
		}
	}
	return p
}

// Supported inputs, as Capabilities lists them.
var (
	supportedFirmware  = []string{"bios", "efi", "kernel"}
	supportedDiskBuses = []string{"virtio", "sata", "scsi", "usb"}
	nicDevices         = map[string]string{"virtio": "virtio-net-pci", "e1000": "e1000", "e1000e": "e1000e", "rtl8139": "rtl8139"}
	supportedNICModels = []string{"virtio", "e1000", "e1000e", "rtl8139"}
	// supportedMachineTypes are what machineRE accepts; whether this QEMU offers a versioned
	// type is known only once it is probed.
	supportedMachineTypes = []string{"q35", "pc", "pc-q35-*", "pc-i440fx-*"}
)

var (
	uuidRE     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	cpuModelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	machineRE  = regexp.MustCompile(`^(q35|pc|pc-q35-[0-9.]+|pc-i440fx-[0-9.]+)$`)
)

const (
	// maxSocketPath is the longest path a unix socket can bind to (sun_path less the NUL).
	maxSocketPath = 107
	// sataPorts is the number of ports of an ICH9 AHCI controller.
	sataPorts = 6
	// maxSerial is the longest disk serial the IDE and virtio-blk devices keep.
	maxSerial = 20
	// maxNICQueues is the most queues a Linux tap has (MAX_TAP_QUEUES).
	maxNICQueues = 256
)

// virtio is the QEMU device of a virtio PCI device model ("virtio-blk-pci"), as the domain
// spec's virtio_transitional wants it: its -transitional variant (legacy and modern
// interfaces) or its -non-transitional one (modern only, virtio 1.0). The named variants are
// explicit wherever the device sits: the plain device is transitional on a q35 machine's root
// bus and on pc, and modern only behind a PCIe root port (disable-legacy=auto). QEMU has had
// them since 4.0; libvirt's virtio-transitional and virtio-non-transitional models, which
// KubeVirt uses, are the same devices.
func (b *argBuilder) virtio(dev string) string {
	if b.spec.GetVirtioTransitional() {
		return dev + "-transitional"
	}
	return dev + "-non-transitional"
}

// esc escapes a value for QEMU's comma-separated option syntax.
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// BuildArgs turns a domain spec into a QEMU command line for the node described by env. The
// spec must have passed domain.Validate. What QEMU (or this driver) cannot honour is a
// domain.ValidationError (InvalidArgument) naming the field; firmware the node lacks is
// FailedPrecondition. QEMU starts with its vCPUs stopped (-S): the caller continues them once
// it is attached to QMP and the serial console, so no early output is lost.
func BuildArgs(spec *domainv1.DomainSpec, env HostEnv) (*Cmdline, error) {
	b := &argBuilder{spec: spec, env: env, paths: RunPaths(spec, env.RunDir)}
	b.build()
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	if b.missing != "" {
		return nil, status.Error(codes.FailedPrecondition, b.missing)
	}
	return &Cmdline{Args: b.args, ExtraFiles: b.files, VarsTemplate: b.varsTemplate, TPM: b.tpmCmd}, nil
}

type argBuilder struct {
	spec         *domainv1.DomainSpec
	env          HostEnv
	paths        Paths
	args         []string
	files        []string
	varsTemplate string
	tpmCmd       *TPMCmd
	errs         domain.ValidationError
	missing      string // a host precondition that does not hold
	q35          bool
	usb          bool     // the USB controller usb0 is on the command line
	iothreads    []string // the pool I/O threads on the command line
	sev          bool     // an SEV guest: virtio devices behind the platform IOMMU
}

var iothreadRE = regexp.MustCompile(`^iothread[0-9]+$`)

// usbController adds the USB controller (usb0) the first time a device needs it.
func (b *argBuilder) usbController() {
	if !b.usb {
		b.add("-device", "qemu-xhci,id=usb0")
		b.usb = true
	}
}

// needHardware records that field needs hardware virtualisation when the VM is emulated: a
// host precondition (FailedPrecondition), as the VMI may run on a node with KVM.
func (b *argBuilder) needHardware(field, what string) {
	if b.env.Accel != AccelKVM && b.missing == "" {
		b.missing = fmt.Sprintf("%s: %s needs hardware virtualisation (KVM), but this VM is emulated (%s)", field, what, b.env.Accel)
	}
}

func (b *argBuilder) add(args ...string) { b.args = append(b.args, args...) }

// accel is the -accel value: the accelerator and, under TCG, a bounded translation cache
// (HostEnv.TCGTranslationCacheMiB) and, for cpu.pinning, a thread per vCPU to pin each:
// multi-threaded TCG, which QEMU refuses to start without rather than fall back to one thread
// for every vCPU.
func (b *argBuilder) accel(spec *domainv1.DomainSpec) string {
	a := string(b.env.Accel)
	if b.env.Accel != AccelTCG {
		return a
	}
	if spec.GetCpu().GetPinning() != nil {
		a += ",thread=multi"
	}
	if n := b.env.TCGTranslationCacheMiB; n > 0 {
		a += fmt.Sprintf(",tb-size=%d", n)
	}
	return a
}

func (b *argBuilder) fail(field, format string, a ...any) {
	b.errs = append(b.errs, domain.FieldError{Field: field, Detail: fmt.Sprintf(format, a...)})
}

func (b *argBuilder) build() {
	spec := b.spec
	switch b.env.Accel {
	case AccelKVM, AccelTCG:
	default:
		b.fail("acceleration", "no usable accelerator %q", b.env.Accel)
	}
	if spec.GetSandbox().GetNetnsPath() != "" && !filepath.IsAbs(spec.GetSandbox().GetNetnsPath()) {
		b.fail("sandbox.netnsPath", "must be an absolute path, not %q", spec.GetSandbox().GetNetnsPath())
	}
	if !filepath.IsAbs(b.env.RunDir) {
		b.fail("runDir", "must be an absolute path, not %q", b.env.RunDir)
	}
	for field, p := range map[string]string{"runDir": b.paths.QMP, "serial.socketPath": b.paths.Serial, "vnc.socketPath": spec.GetVnc().GetSocketPath()} {
		if len(p) > maxSocketPath {
			b.fail(field, "socket path %q is longer than %d bytes", p, maxSocketPath)
		}
	}

	name := spec.GetName()
	if name == "" {
		name = spec.GetId()
	}
	b.add("-name", "guest="+esc(name)+",debug-threads=on")
	if u := spec.GetUuid(); u != "" {
		if !uuidRE.MatchString(u) {
			b.fail("uuid", "%q is not a UUID", u)
		}
		b.add("-uuid", u)
	}
	b.machine()
	b.add("-accel", b.accel(spec))
	b.cpu()
	b.memory()
	if s := spec.GetFirmware().GetSerial(); s != "" {
		b.add("-smbios", "type=1,serial="+esc(s))
	}
	if c := spec.GetChassis(); c != nil {
		var opts []string
		for _, kv := range []struct{ k, v string }{{"manufacturer", c.GetManufacturer()}, {"version", c.GetVersion()}, {"serial", c.GetSerial()}, {"asset", c.GetAsset()}, {"sku", c.GetSku()}} {
			if kv.v != "" {
				opts = append(opts, kv.k+"="+esc(kv.v))
			}
		}
		if len(opts) > 0 {
			b.add("-smbios", "type=3,"+strings.Join(opts, ","))
		}
	}
	b.add("-nodefaults", "-no-user-config", "-display", "none", "-S", "-msg", "timestamp=on")
	if spec.GetIncomingMigration() != nil {
		// A migration target: the driver names the socket with migrate-incoming once it set the
		// migration's capabilities (migrate.go).
		b.add("-incoming", "defer")
	}
	// A panicking guest (pvpanic) ends QEMU, as a guest powering off does: the VM is CRASHED.
	b.add("-action", "panic=shutdown")
	// seccomp, as libvirt sets it: QEMU needs none of what this forbids.
	b.add("-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	b.add("-pidfile", b.paths.PID)
	b.add("-chardev", "socket,id=qmp,path="+esc(b.paths.QMP)+",server=on,wait=off", "-mon", "chardev=qmp,mode=control")
	b.add("-chardev", "socket,id=serial0,path="+esc(b.paths.Serial)+",server=on,wait=off", "-serial", "chardev:serial0")
	addressedNICs, otherNICs := b.nics()
	b.add(addressedNICs...)
	if v := spec.GetVnc(); v != nil {
		b.add("-device", "VGA,id=video0", "-vnc", "unix:"+esc(v.GetSocketPath()))
	}
	b.firmware()
	b.add("-device", "pvpanic")
	b.guestAgent()
	if spec.GetRng() != nil {
		// The host's /dev/urandom, as libvirt's and KubeVirt's default: it never blocks.
		b.add("-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", b.virtio("virtio-rng-pci")+",rng=rng0,id=rng")
	}
	b.rtc()
	b.inputs()
	b.watchdog()
	b.sound()
	if b.spec.GetBalloon() != nil {
		b.add("-device", b.virtio("virtio-balloon-pci")+",id=balloon0")
	}
	b.disks()
	b.add(otherNICs...)
	b.errs = append(b.errs, domain.NonPCIHostDevices(spec)...)
	for i, h := range spec.GetHostDevices() {
		if h.GetPciAddress() != "" {
			b.add("-device", fmt.Sprintf("vfio-pci,host=%s,id=hostdev%d", h.GetPciAddress(), i))
		}
	}
	if b.sev {
		b.iommuPlatform()
	}
	b.tpm() // last: its fd follows every passed file
}

// AgentPort is the name of the guest agent's virtio-serial port, the QEMU guest agent's
// (qemu-ga looks for /dev/virtio-ports/org.qemu.guest_agent.0).
const AgentPort = "org.qemu.guest_agent.0"

// guestAgent adds the guest agent's channel, to every VM as KubeVirt does whether or not the
// guest runs an agent: a virtio-serial controller with one port named AgentPort, whose host side
// is a socket chardev in the run dir that the driver alone connects to (GuestAgentInfo).
func (b *argBuilder) guestAgent() {
	b.add("-device", b.virtio("virtio-serial-pci")+",id=virtio-serial0",
		"-chardev", "socket,id=qga0,path="+esc(b.paths.Agent)+",server=on,wait=off",
		"-device", "virtserialport,bus=virtio-serial0.0,chardev=qga0,name="+AgentPort)
}

func (b *argBuilder) machine() {
	t := b.spec.GetMachine().GetType()
	if t == "" {
		t = "q35"
	}
	switch {
	case !machineRE.MatchString(t):
		b.fail("machine.type", "%q is not supported (q35, pc, pc-q35-X.Y or pc-i440fx-X.Y)", t)
	case b.env.MachineTypes != nil && !slices.Contains(b.env.MachineTypes, t):
		b.fail("machine.type", "%q is not offered by this QEMU", t)
	}
	b.q35 = t == "q35" || strings.HasPrefix(t, "pc-q35-")
	opts := []string{t}
	opts = append(opts, b.machineFeatures()...)
	if efi := b.spec.GetFirmware().GetEfi(); efi != nil {
		opts = append(opts, "pflash0=pflash0", "pflash1=pflash1")
	}
	if enc := b.launchSecurity(); enc != "" {
		opts = append(opts, enc)
	}
	if b.spec.GetMemory().GetHugepages() != nil && len(b.spec.GetCpu().GetNumaCells()) == 0 {
		// With NUMA nodes the guest RAM is theirs (-numa node,memdev=).
		opts = append(opts, "memory-backend="+guestMemoryID)
	}
	b.add("-machine", strings.Join(opts, ","))
}

func (b *argBuilder) cpu() {
	cpu := b.spec.GetCpu()
	model := cpu.GetModel()
	kvm := b.env.Accel == AccelKVM
	switch {
	case model == "" || model == "host-model":
		// host-model is "like the host, but migratable": the nearest QEMU offers is host under
		// KVM and max (every feature TCG emulates) under TCG.
		model = map[bool]string{true: "host", false: "max"}[kvm]
	case model == "host-passthrough":
		if !kvm {
			b.fail("cpu.model", "host-passthrough needs hardware acceleration, but this VM is emulated (%s)", b.env.Accel)
		}
		model = "host"
	case !cpuModelRE.MatchString(model):
		b.fail("cpu.model", "%q is not a CPU model name", model)
	case b.env.CPUModels != nil && !slices.Contains(b.env.CPUModels, model):
		b.fail("cpu.model", "%q is not offered by this QEMU", model)
	}
	b.add("-cpu", strings.Join(slices.Concat([]string{model}, b.cpuFeatures(), b.cpuFlags()), ","))
	s, c, t := max(cpu.GetSockets(), 1), max(cpu.GetCores(), 1), max(cpu.GetThreads(), 1)
	b.add("-smp", fmt.Sprintf("%d,sockets=%d,cores=%d,threads=%d", s*c*t, s, c, t))
}

// guestMemoryID is the id of the memory backend of guest RAM on huge pages, which -machine
// memory-backend names.
const guestMemoryID = "mem0"

// memory is -m, and for guest RAM on huge pages its backend: a file QEMU makes (and unlinks)
// in the hugetlbfs directory, private to QEMU (share=off: nothing else maps the guest's RAM),
// preallocated (prealloc=on): the pod's hugepages request holds the pages for this VM alone,
// so taking them all at start costs no one, and a shortfall (too few free pages, the hugetlb
// cgroup's limit) fails the start with QEMU's error instead of killing the running guest with
// SIGBUS at its first touch of a page that is not there. The backend's size must equal -m.
func (b *argBuilder) memory() {
	const mib = 1 << 20
	n := b.spec.GetMemory().GetGuestBytes()
	size := strconv.FormatUint(n, 10) + "B"
	if n%mib == 0 {
		size = strconv.FormatUint(n/mib, 10) + "M"
	}
	b.add("-m", size)
	h := b.spec.GetMemory().GetHugepages()
	if cells := b.spec.GetCpu().GetNumaCells(); len(cells) > 0 {
		defer b.numa(cells, h)
	}
	if h == nil {
		return
	}
	switch ps := h.GetPageSizeBytes(); ps {
	case 2 << 20, 1 << 30:
		if n%ps != 0 {
			b.fail("memory.guestBytes", "%d is not a multiple of the huge page size %d", n, ps)
		}
	default:
		b.fail("memory.hugepages.pageSizeBytes", "%d is not supported (2 MiB or 1 GiB)", ps)
	}
	if !filepath.IsAbs(h.GetPath()) {
		b.fail("memory.hugepages.path", "must be an absolute path, not %q", h.GetPath())
	}
	if len(b.spec.GetCpu().GetNumaCells()) > 0 {
		return // the NUMA nodes have a backend each
	}
	b.add("-object", "memory-backend-file,id="+guestMemoryID+",size="+size+",mem-path="+esc(h.GetPath())+",prealloc=on,share=off")
}

// numa is the guest NUMA nodes of cpu.numa_cells: node i with its vCPUs and a memory backend
// of its own (on the huge pages h, like the whole guest RAM's without NUMA), bound to the host
// nodes given (host-nodes, policy=bind: QEMU mbind(2)s the backend, and the start fails when
// the memory cannot come from there, for one when the sandbox's cpuset.mems lacks the node).
func (b *argBuilder) numa(cells []*domainv1.NUMACell, h *domainv1.Hugepages) {
	for i, c := range cells {
		id := fmt.Sprintf("mem-numa%d", i)
		backend := "memory-backend-ram,id=" + id + ",size=" + strconv.FormatUint(c.GetMemoryBytes(), 10)
		if h != nil {
			backend = "memory-backend-file,id=" + id + ",size=" + strconv.FormatUint(c.GetMemoryBytes(), 10) +
				",mem-path=" + esc(h.GetPath()) + ",prealloc=on,share=off"
		}
		if hn := c.GetHostNodes(); len(hn) > 0 {
			nodes := make([]string, len(hn))
			for j, n := range hn {
				nodes[j] = strconv.FormatUint(uint64(n), 10)
			}
			// QEMU's list syntax: host-nodes=0,host-nodes=2 for nodes 0 and 2.
			backend += ",host-nodes=" + strings.Join(nodes, ",host-nodes=") + ",policy=bind"
		}
		b.add("-object", backend)
		node := fmt.Sprintf("node,nodeid=%d,memdev=%s", i, id)
		for _, v := range c.GetVcpus() {
			node += fmt.Sprintf(",cpus=%d", v)
		}
		b.add("-numa", node)
	}
}

func (b *argBuilder) firmware() {
	fw := b.spec.GetFirmware()
	switch {
	case fw.GetEfi() != nil:
		code, vars := b.env.OVMF.Code, b.env.OVMF.Vars
		if fw.GetEfi().GetSecureBoot() {
			if !b.q35 {
				b.fail("firmware.efi.secureBoot", "needs a q35 machine type (SMM)")
			}
			code, vars = b.env.OVMF.SecureCode, b.env.OVMF.SecureVars
		}
		if code == "" || vars == "" {
			b.missing = "firmware.efi: UEFI firmware (OVMF) is not installed on this node"
		}
		b.varsTemplate = vars
		b.add("-blockdev", "driver=file,node-name=pflash0,read-only=on,filename="+esc(code))
		b.add("-blockdev", "driver=file,node-name=pflash1,filename="+esc(b.paths.Vars))
		if fw.GetEfi().GetSecureBoot() {
			b.add("-global", "driver=cfi.pflash01,property=secure,value=on")
		}
	case fw.GetKernel() != nil:
		k := fw.GetKernel()
		b.add("-kernel", k.GetKernelPath())
		if k.GetInitrdPath() != "" {
			b.add("-initrd", k.GetInitrdPath())
		}
		if k.GetCmdline() != "" {
			b.add("-append", k.GetCmdline())
		}
	}
	// BIOS (or nothing) is QEMU's default firmware, SeaBIOS.
}

// diskBus is the bus a disk is on: virtio for a disk and sata for a cdrom when unnamed (as
// KubeVirt defaults them).
func diskBus(d *domainv1.Disk) domainv1.DiskBus {
	if bus := d.GetBus(); bus != domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
		return bus
	}
	switch d.GetDevice() {
	case domainv1.DiskDevice_DISK_DEVICE_CDROM:
		return domainv1.DiskBus_DISK_BUS_SATA
	case domainv1.DiskDevice_DISK_DEVICE_LUN:
		return domainv1.DiskBus_DISK_BUS_SCSI
	}
	return domainv1.DiskBus_DISK_BUS_VIRTIO
}

func (b *argBuilder) disks() {
	// Controllers first: QEMU creates devices in command-line order.
	need := map[domainv1.DiskBus]bool{}
	for _, d := range b.spec.GetDisks() {
		need[diskBus(d)] = true
	}
	if need[domainv1.DiskBus_DISK_BUS_SATA] && !b.q35 {
		b.add("-device", "ich9-ahci,id=sata0")
	}
	if need[domainv1.DiskBus_DISK_BUS_SCSI] {
		b.add("-device", b.virtio("virtio-scsi-pci")+",id=scsi0")
	}
	if need[domainv1.DiskBus_DISK_BUS_USB] {
		b.usbController()
	}
	sataPort, lun := 0, 0
	for i, d := range b.spec.GetDisks() {
		f := fmt.Sprintf("disks[%d]", i)
		cdrom := d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_CDROM
		if d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN {
			b.lunDisk(f, i, d, lun)
			lun++
			continue
		}
		bus := diskBus(d)
		var format string
		switch d.GetFormat() {
		case domainv1.DiskFormat_DISK_FORMAT_UNSPECIFIED, domainv1.DiskFormat_DISK_FORMAT_RAW:
			// Like libvirt, an unnamed format is raw: the driver never probes, as probing a
			// guest-writable raw image is unsafe.
			format = "raw"
		case domainv1.DiskFormat_DISK_FORMAT_QCOW2:
			format = "qcow2"
		default:
			b.fail(f+".format", "%s is not supported (raw or qcow2)", d.GetFormat())
		}
		readOnly := d.GetReadOnly() || cdrom
		fileOpts := []string{"driver=file"}
		if b.env.BlockDevices[d.GetPath()] {
			fileOpts[0] = "driver=host_device"
		}
		fileOpts = append(fileOpts, fmt.Sprintf("node-name=file-disk%d", i), "filename="+esc(d.GetPath()))
		if readOnly {
			fileOpts = append(fileOpts, "read-only=on")
		}
		var writeCache string
		switch d.GetCache() {
		case "":
		case "none":
			fileOpts = append(fileOpts, "cache.direct=on")
			writeCache = "on"
		case "writeback":
			writeCache = "on"
		case "writethrough":
			writeCache = "off"
		default:
			b.fail(f+".cache", "%q is not supported (none, writethrough or writeback)", d.GetCache())
		}
		switch d.GetIo() {
		case "":
		case "native":
			if d.GetCache() != "none" {
				b.fail(f+".io", "native needs cache none")
			}
			fileOpts = append(fileOpts, "aio=native")
		case "threads":
			fileOpts = append(fileOpts, "aio=threads")
		default:
			b.fail(f+".io", "%q is not supported (native or threads)", d.GetIo())
		}
		if d.GetShareable() {
			// Other VMs may hold the image open for writing.
			fileOpts = append(fileOpts, "locking=off")
		}
		fmtOpts := []string{"driver=" + format, fmt.Sprintf("node-name=disk%d", i), fmt.Sprintf("file=file-disk%d", i)}
		if readOnly {
			fmtOpts = append(fmtOpts, "read-only=on")
		}

		var dev []string
		switch bus {
		case domainv1.DiskBus_DISK_BUS_VIRTIO:
			if cdrom {
				b.fail(f+".bus", "a cdrom cannot be on virtio (use sata or scsi)")
			}
			dev = []string{b.virtio("virtio-blk-pci")}
			if q := d.GetQueues(); q > 0 {
				dev = append(dev, fmt.Sprintf("num-queues=%d", q))
			}
			switch t := d.GetIothread(); {
			case d.GetDedicatedIothread():
				b.add("-object", fmt.Sprintf("iothread,id=iothread-disk%d", i))
				dev = append(dev, fmt.Sprintf("iothread=iothread-disk%d", i))
			case t != "":
				if !iothreadRE.MatchString(t) {
					b.fail(f+".iothread", "%q is not an I/O thread name (iothread<n>)", t)
				}
				if !slices.Contains(b.iothreads, t) {
					b.iothreads = append(b.iothreads, t)
					b.add("-object", "iothread,id="+t)
				}
				dev = append(dev, "iothread="+t)
			}
		case domainv1.DiskBus_DISK_BUS_SATA:
			if d.GetReadOnly() && !cdrom {
				b.fail(f+".readOnly", "a read-only disk cannot be on sata (use virtio or scsi)")
			}
			if sataPort >= sataPorts {
				b.fail(f+".bus", "more than %d sata disks", sataPorts)
			}
			ctl := "ide" // the AHCI controller built into q35
			if !b.q35 {
				ctl = "sata0"
			}
			dev = []string{map[bool]string{false: "ide-hd", true: "ide-cd"}[cdrom], fmt.Sprintf("bus=%s.%d", ctl, sataPort)}
			sataPort++
		case domainv1.DiskBus_DISK_BUS_SCSI:
			dev = []string{map[bool]string{false: "scsi-hd", true: "scsi-cd"}[cdrom], "bus=scsi0.0", "channel=0", "scsi-id=0", fmt.Sprintf("lun=%d", lun)}
			lun++
		case domainv1.DiskBus_DISK_BUS_USB:
			if cdrom {
				b.fail(f+".bus", "a cdrom cannot be on usb (use sata or scsi)")
			}
			dev = []string{"usb-storage", "bus=usb0.0"}
		default:
			b.fail(f+".bus", "%s is not supported", bus)
			continue
		}
		if d.GetQueues() > 0 && bus != domainv1.DiskBus_DISK_BUS_VIRTIO {
			b.fail(f+".queues", "only a virtio disk has queues")
		}
		if d.GetIothread() != "" && bus != domainv1.DiskBus_DISK_BUS_VIRTIO {
			b.fail(f+".iothread", "only a virtio disk has an I/O thread")
		}
		if d.GetDedicatedIothread() && bus != domainv1.DiskBus_DISK_BUS_VIRTIO {
			b.fail(f+".dedicatedIothread", "only a virtio disk has an I/O thread of its own")
		}
		dev = append(dev, fmt.Sprintf("drive=disk%d", i), fmt.Sprintf("id=ua-disk%d", i))
		dev = append(dev, b.diskDeviceOptions(f, d)...)
		if writeCache != "" {
			dev = append(dev, "write-cache="+writeCache)
		}
		if s := d.GetSerial(); s != "" {
			if len(s) > maxSerial {
				b.fail(f+".serial", "%q is longer than %d characters", s, maxSerial)
			}
			dev = append(dev, "serial="+esc(s))
		}
		if o := d.GetBootOrder(); o > 0 {
			dev = append(dev, fmt.Sprintf("bootindex=%d", o))
		}
		b.add("-blockdev", strings.Join(fileOpts, ","), "-blockdev", strings.Join(fmtOpts, ","), "-device", strings.Join(dev, ","))
	}
}

// lunDisk builds a lun: the device itself as a host_device node (no format layer: the guest
// speaks SCSI to it) under a scsi-block device, which passes the guest's commands through with
// SG_IO. n is its LUN on the scsi0 bus, which it shares with the scsi disks and cdroms.
func (b *argBuilder) lunDisk(f string, i int, d *domainv1.Disk, n int) {
	if bus := diskBus(d); bus != domainv1.DiskBus_DISK_BUS_SCSI {
		b.fail(f+".bus", "a lun is on scsi only, not %s", bus)
	}
	switch d.GetFormat() {
	case domainv1.DiskFormat_DISK_FORMAT_UNSPECIFIED, domainv1.DiskFormat_DISK_FORMAT_RAW:
	default:
		b.fail(f+".format", "a lun is the device itself (raw), not %s", d.GetFormat())
	}
	if problem, ok := b.env.SGIO[d.GetPath()]; !ok {
		b.fail(f+".path", "disk %s: lun needs a SCSI device that takes SG_IO; %s was not checked", d.GetName(), d.GetPath())
	} else if problem != "" {
		b.fail(f+".path", "disk %s: lun needs a SCSI device that takes SG_IO; %s is not (%s)", d.GetName(), d.GetPath(), problem)
	}
	// scsi-block has no serial, block sizes or write cache of its own: the device's are what the
	// guest sees.
	if d.GetSerial() != "" {
		b.fail(f+".serial", "a lun has the serial number of its device")
	}
	if d.GetLogicalBlockSize() != 0 || d.GetPhysicalBlockSize() != 0 {
		b.fail(f+".logicalBlockSize", "a lun has the block sizes of its device")
	}
	opts := []string{"driver=host_device", fmt.Sprintf("node-name=file-disk%d", i), "filename=" + esc(d.GetPath())}
	if d.GetReadOnly() {
		// QEMU opens the device O_RDONLY; the kernel then refuses SCSI commands that write.
		opts = append(opts, "read-only=on")
	}
	switch d.GetCache() {
	case "":
	case "none":
		opts = append(opts, "cache.direct=on")
	default:
		b.fail(f+".cache", "%q is not supported for a lun (none, or unset: the guest drives the device's own cache)", d.GetCache())
	}
	switch d.GetIo() {
	case "":
	case "native":
		if d.GetCache() != "none" {
			b.fail(f+".io", "native needs cache none")
		}
		opts = append(opts, "aio=native")
	case "threads":
		opts = append(opts, "aio=threads")
	default:
		b.fail(f+".io", "%q is not supported (native or threads)", d.GetIo())
	}
	if d.GetShareable() {
		opts = append(opts, "locking=off")
	}
	for _, bad := range []struct {
		set  bool
		name string
	}{{d.GetQueues() > 0, "queues"}, {d.GetIothread() != "", "iothread"}, {d.GetDedicatedIothread(), "dedicatedIothread"}} {
		if bad.set {
			b.fail(f+"."+bad.name, "only a virtio disk has %s", bad.name)
		}
	}
	dev := []string{"scsi-block", "bus=scsi0.0", "channel=0", "scsi-id=0", fmt.Sprintf("lun=%d", n), fmt.Sprintf("drive=file-disk%d", i), fmt.Sprintf("id=ua-disk%d", i)}
	dev = append(dev, b.diskDeviceOptions(f, d)...)
	if o := d.GetBootOrder(); o > 0 {
		dev = append(dev, fmt.Sprintf("bootindex=%d", o))
	}
	b.add("-blockdev", strings.Join(opts, ","), "-device", strings.Join(dev, ","))
}

// errorPolicies are the -device werror/rerror values of each error policy: enospace stops on
// a full host disk only, and reports read errors.
var errorPolicies = map[string][2]string{
	"stop": {"stop", "stop"}, "report": {"report", "report"}, "ignore": {"ignore", "ignore"}, "enospace": {"enospc", "report"},
}

// diskDeviceOptions are a disk device's block sizes, shared writing and error policy.
func (b *argBuilder) diskDeviceOptions(f string, d *domainv1.Disk) []string {
	var opts []string
	for _, bs := range []struct {
		name string
		n    uint32
	}{{"logical_block_size", d.GetLogicalBlockSize()}, {"physical_block_size", d.GetPhysicalBlockSize()}} {
		if bs.n == 0 {
			continue
		}
		if bs.n < 512 || bs.n > 65536 || bs.n&(bs.n-1) != 0 {
			b.fail(f+"."+strings.ReplaceAll(bs.name, "_block_size", "BlockSize"), "%d is not a power of two from 512 to 65536", bs.n)
		}
		opts = append(opts, fmt.Sprintf("%s=%d", bs.name, bs.n))
	}
	if d.GetShareable() {
		opts = append(opts, "share-rw=on")
	}
	if p := d.GetErrorPolicy(); p != "" {
		e, ok := errorPolicies[p]
		if !ok {
			b.fail(f+".errorPolicy", "%q is not supported (stop, report, ignore or enospace)", p)
		}
		if d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_CDROM || d.GetBus() == domainv1.DiskBus_DISK_BUS_USB {
			b.fail(f+".errorPolicy", "a cdrom or usb disk has no error policy")
		}
		opts = append(opts, "werror="+e[0], "rerror="+e[1])
	}
	return opts
}

// nicArgs are one NIC's -netdev and -device.
type nicArgs struct {
	args      []string
	addressed bool // it has a PCI address of its own
}

// nics builds every NIC's arguments. Those with a PCI address go first on the command line, so
// that QEMU, which gives the other devices the first free slot as it creates them, has not given
// theirs away; the rest go where nics is called from.
func (b *argBuilder) nics() (addressed, rest []string) {
	for _, n := range b.buildNICs() {
		if n.addressed {
			addressed = append(addressed, n.args...)
		} else {
			rest = append(rest, n.args...)
		}
	}
	return addressed, rest
}

func (b *argBuilder) buildNICs() []nicArgs {
	var out []nicArgs
	for i, n := range b.spec.GetNics() {
		f := fmt.Sprintf("nics[%d]", i)
		model := n.GetModel()
		if model == "" {
			model = "virtio"
		}
		devName, ok := nicDevices[model]
		if !ok {
			b.fail(f+".model", "%q is not supported (%s)", model, strings.Join(supportedNICModels, ", "))
		}
		if model == "virtio" {
			devName = b.virtio(devName)
		}
		netdev := []string{"tap", fmt.Sprintf("id=net%d", i)}
		switch {
		case n.GetTapName() != "":
			if len(n.GetTapName()) > 15 || strings.ContainsAny(n.GetTapName(), ",/ ") {
				b.fail(f+".tapName", "%q is not an interface name", n.GetTapName())
			}
			netdev = append(netdev, "ifname="+n.GetTapName(), "script=no", "downscript=no")
		case n.GetTapFdPath() != "":
			if !filepath.IsAbs(n.GetTapFdPath()) {
				b.fail(f+".tapFdPath", "must be an absolute path, not %q", n.GetTapFdPath())
			}
			netdev = append(netdev, fmt.Sprintf("fd=%d", 3+len(b.files)))
			b.files = append(b.files, n.GetTapFdPath())
		}
		if model == "virtio" && b.env.VhostNet {
			netdev = append(netdev, "vhost=on")
		}
		dev := []string{devName, fmt.Sprintf("id=ua-net%d", i), fmt.Sprintf("netdev=net%d", i), "mac=" + strings.ToLower(n.GetMac())}
		if q := n.GetQueues(); q > 1 {
			switch {
			case model != "virtio":
				b.fail(f+".queues", "only a virtio NIC has more than one queue, not %q", model)
			case n.GetTapFdPath() != "":
				b.fail(f+".queues", "a tap passed as a descriptor has one queue (pass tapName)")
			case q > maxNICQueues:
				b.fail(f+".queues", "%d is more than a tap has (%d)", q, maxNICQueues)
			}
			// QEMU opens the multi-queue tap q times; the guest gets q queue pairs, whose rx
			// and tx interrupts, with the config and control ones, take 2q+2 MSI-X vectors.
			netdev = append(netdev, fmt.Sprintf("queues=%d", q))
			dev = append(dev, "mq=on", fmt.Sprintf("vectors=%d", 2*q+2))
		}
		if mtu := n.GetMtu(); mtu > 0 {
			// The tap carries the MTU for every model (the network driver set it); virtio
			// also tells the guest.
			if mtu < 68 || mtu > 65535 {
				b.fail(f+".mtu", "%d is out of range (68-65535)", mtu)
			}
			if model == "virtio" {
				dev = append(dev, fmt.Sprintf("host_mtu=%d", mtu))
			}
		}
		if o := n.GetBootOrder(); o > 0 {
			dev = append(dev, fmt.Sprintf("bootindex=%d", o))
		}
		addressed := false
		if a := n.GetPciAddress(); a != "" {
			m := pciRootRE.FindStringSubmatch(a)
			if m == nil {
				b.fail(f+".pciAddress", "%q is not a PCI address on the root bus (0000:00:<slot>.<function>)", a)
			} else {
				dev = append(dev, "bus="+map[bool]string{true: "pcie.0", false: "pci.0"}[b.q35], "addr=0x"+m[1]+".0x"+m[2])
				addressed = true
			}
		}
		if x := n.GetAcpiIndex(); x != 0 {
			if x > 16383 {
				b.fail(f+".acpiIndex", "%d is out of range (1-16383)", x)
			}
			if b.q35 {
				// Measured with QEMU 7.2: it takes the property, and the guest finds no index.
				b.fail(f+".acpiIndex", "this QEMU gives devices on a q35 machine's root bus no ACPI index: it needs machine type pc")
			}
			dev = append(dev, fmt.Sprintf("acpi-index=%d", x))
		}
		out = append(out, nicArgs{args: []string{"-netdev", strings.Join(netdev, ","), "-device", strings.Join(dev, ",")}, addressed: addressed})
	}
	return out
}

// pciRootRE is a PCI address on the root bus: its slot and function.
var pciRootRE = regexp.MustCompile(`^0000:00:([0-1][0-9a-f])\.([0-7])$`)
