// Package domain holds the driver-neutral domain spec (package v1, generated from domain.proto)
// and the rules every hypervisor driver applies to it before use.
package domain

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// MaxVCPUs is the largest vCPU count a domain may ask for.
const MaxVCPUs = 512

// MaxSocketPath is the longest path a unix socket can be bound at on Linux (sun_path less its
// terminating NUL).
const MaxSocketPath = 107

// FieldError is one rule a domain spec breaks, with the path of the field that breaks it.
type FieldError struct {
	Field  string
	Detail string
}

func (e FieldError) Error() string { return e.Field + ": " + e.Detail }

// ValidationError is every rule a domain spec breaks.
type ValidationError []FieldError

func (e ValidationError) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		parts[i] = fe.Error()
	}
	return "invalid domain spec: " + strings.Join(parts, "; ")
}

// GRPCStatus makes a ValidationError reach the host as InvalidArgument.
func (e ValidationError) GRPCStatus() *status.Status {
	return status.New(codes.InvalidArgument, e.Error())
}

var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Validate checks what holds for every hypervisor: an id, guest memory, a sane CPU topology,
// absolute paths, unique disk and NIC names, distinct boot orders, valid MACs, a lun on scsi and raw. It returns nil or
// a ValidationError (InvalidArgument over gRPC). A driver adds its own checks for what it cannot
// honour.
func Validate(spec *domainv1.DomainSpec) error {
	var errs ValidationError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}
	if spec == nil {
		return ValidationError{{Field: "domain", Detail: "required"}}
	}
	if spec.GetId() == "" {
		add("id", "required")
	}
	if spec.GetMemory().GetGuestBytes() == 0 {
		add("memory.guestBytes", "required and > 0")
	}
	if h := spec.GetMemory().GetHugepages(); h != nil {
		size := h.GetPageSizeBytes()
		switch {
		case size == 0 || size&(size-1) != 0:
			add("memory.hugepages.pageSizeBytes", "must be a power of two, not %d", size)
		case spec.GetMemory().GetGuestBytes()%size != 0:
			add("memory.guestBytes", "%d is not a multiple of the huge page size %d", spec.GetMemory().GetGuestBytes(), size)
		}
		if !filepath.IsAbs(h.GetPath()) {
			add("memory.hugepages.path", "must be an absolute path, not %q", h.GetPath())
		}
	}
	if cpu := spec.GetCpu(); cpu != nil {
		n := uint64(max(cpu.GetSockets(), 1)) * uint64(max(cpu.GetCores(), 1)) * uint64(max(cpu.GetThreads(), 1))
		if n > MaxVCPUs {
			add("cpu", "%d vCPUs exceed the maximum of %d", n, MaxVCPUs)
		}
		if p := cpu.GetPinning(); p != nil && n <= MaxVCPUs {
			validatePinning(p, int(n), add)
		}
		if cells := cpu.GetNumaCells(); len(cells) > 0 && n <= MaxVCPUs {
			validateNUMA(cells, int(n), spec.GetMemory(), add)
		}
	}
	if k := spec.GetFirmware().GetKernel(); k != nil {
		if k.GetKernelPath() == "" {
			add("firmware.kernel.kernelPath", "required")
		} else if !filepath.IsAbs(k.GetKernelPath()) {
			add("firmware.kernel.kernelPath", "must be an absolute path, not %q", k.GetKernelPath())
		}
		if k.GetInitrdPath() != "" && !filepath.IsAbs(k.GetInitrdPath()) {
			add("firmware.kernel.initrdPath", "must be an absolute path, not %q", k.GetInitrdPath())
		}
	}
	boot := map[uint32]string{}
	checkBoot := func(field, name string, order uint32) {
		if order == 0 {
			return
		}
		if other, ok := boot[order]; ok {
			add(field, "boot order %d is also used by %s", order, other)
			return
		}
		boot[order] = name
	}
	disks := map[string]bool{}
	for i, d := range spec.GetDisks() {
		f := fmt.Sprintf("disks[%d]", i)
		switch {
		case d.GetName() == "":
			add(f+".name", "required")
		case disks[d.GetName()]:
			add(f+".name", "duplicate disk name %q", d.GetName())
		}
		disks[d.GetName()] = true
		if !filepath.IsAbs(d.GetPath()) {
			add(f+".path", "must be an absolute path, not %q", d.GetPath())
		}
		checkBoot(f+".bootOrder", "disk "+d.GetName(), d.GetBootOrder())
		if d.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN {
			if b := d.GetBus(); b != domainv1.DiskBus_DISK_BUS_SCSI && b != domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
				add(f+".bus", "disk %s: a lun is on scsi only, not %s", d.GetName(), b)
			}
			if fm := d.GetFormat(); fm != domainv1.DiskFormat_DISK_FORMAT_RAW && fm != domainv1.DiskFormat_DISK_FORMAT_UNSPECIFIED {
				add(f+".format", "disk %s: a lun is the device itself (raw), not %s", d.GetName(), fm)
			}
		}
	}
	nics := map[string]bool{}
	for i, n := range spec.GetNics() {
		f := fmt.Sprintf("nics[%d]", i)
		switch {
		case n.GetName() == "":
			add(f+".name", "required")
		case nics[n.GetName()]:
			add(f+".name", "duplicate interface name %q", n.GetName())
		}
		nics[n.GetName()] = true
		if (n.GetTapName() == "") == (n.GetTapFdPath() == "") {
			add(f, "exactly one of tapName and tapFdPath must be set")
		}
		if hw, err := net.ParseMAC(n.GetMac()); err != nil || len(hw) != 6 {
			add(f+".mac", "%q is not a MAC address", n.GetMac())
		} else if hw[0]&1 == 1 {
			add(f+".mac", "%q is a multicast address", n.GetMac())
		}
		checkBoot(f+".bootOrder", "interface "+n.GetName(), n.GetBootOrder())
	}
	if s := spec.GetSerial(); s != nil && !filepath.IsAbs(s.GetSocketPath()) {
		add("serial.socketPath", "must be an absolute path, not %q", s.GetSocketPath())
	}
	if v := spec.GetVnc(); v != nil && !filepath.IsAbs(v.GetSocketPath()) {
		add("vnc.socketPath", "must be an absolute path, not %q", v.GetSocketPath())
	}
	// The persistent state directory goes with the state kept in it: both or neither.
	persistent := spec.GetTpm().GetPersistent() || spec.GetFirmware().GetEfi().GetPersistent()
	switch dir := spec.GetPersistentStateDir(); {
	case persistent && dir == "":
		add("persistentStateDir", "required with tpm.persistent or firmware.efi.persistent")
	case !persistent && dir != "":
		add("persistentStateDir", "set without tpm.persistent or firmware.efi.persistent, which keep state in it")
	case dir != "" && !filepath.IsAbs(dir):
		add("persistentStateDir", "must be an absolute path, not %q", dir)
	}
	if in := spec.GetIncomingMigration(); in != nil {
		switch p := in.GetSocketPath(); {
		case p == "":
			add("incomingMigration.socketPath", "required")
		case !filepath.IsAbs(p):
			add("incomingMigration.socketPath", "must be an absolute path, not %q", p)
		case len(p) > MaxSocketPath:
			add("incomingMigration.socketPath", "%q is longer than a unix socket path can be (%d bytes)", p, MaxSocketPath)
		case spec.GetRunDir() != "" && !strings.HasPrefix(p, filepath.Clean(spec.GetRunDir())+"/"):
			add("incomingMigration.socketPath", "%q is not in runDir %q", p, spec.GetRunDir())
		}
		if spec.GetStartPaused() {
			add("startPaused", "not with incomingMigration: the VM runs as the source did")
		}
		validateIncomingDisks(spec, in, add)
	}
	for i, h := range spec.GetHostDevices() {
		// A device with no PCI address is known by its device driver's resource (a hypervisor
		// driver that cannot give it to the guest refuses it: HostDeviceWithoutPCI).
		switch p := h.GetPciAddress(); {
		case p == "" && h.GetResource() == "":
			add(fmt.Sprintf("hostDevices[%d]", i), "%q has neither a PCI address nor a device resource", h.GetName())
		case p != "" && !pciAddress.MatchString(p):
			add(fmt.Sprintf("hostDevices[%d].pciAddress", i), "%q is not a PCI address (dddd:bb:ss.f)", p)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// validatePinning checks a CPUPinning of a domain of n vCPUs: a host CPU per vCPU, distinct, and
// emulator CPUs apart from them.
func validatePinning(p *domainv1.CPUPinning, n int, add func(field, format string, args ...any)) {
	if len(p.GetVcpuHostCpus()) != n {
		add("cpu.pinning.vcpuHostCpus", "%d host CPUs for %d vCPUs: one per vCPU", len(p.GetVcpuHostCpus()), n)
	}
	vcpu := map[uint32]int{}
	for i, c := range p.GetVcpuHostCpus() {
		if j, ok := vcpu[c]; ok {
			add(fmt.Sprintf("cpu.pinning.vcpuHostCpus[%d]", i), "host CPU %d is also vCPU %d's", c, j)
			continue
		}
		vcpu[c] = i
	}
	seen := map[uint32]bool{}
	for i, c := range p.GetEmulatorHostCpus() {
		f := fmt.Sprintf("cpu.pinning.emulatorHostCpus[%d]", i)
		if j, ok := vcpu[c]; ok {
			add(f, "host CPU %d is vCPU %d's", c, j)
		} else if seen[c] {
			add(f, "duplicate host CPU %d", c)
		}
		seen[c] = true
	}
}

// validateNUMA checks the guest NUMA nodes of a domain of n vCPUs: each vCPU in one node, each
// node with memory (whole huge pages on huge pages), all of the guest memory in them.
func validateNUMA(cells []*domainv1.NUMACell, n int, mem *domainv1.Memory, add func(field, format string, args ...any)) {
	in := map[uint32]int{}
	var total uint64
	page := mem.GetHugepages().GetPageSizeBytes()
	for i, c := range cells {
		f := fmt.Sprintf("cpu.numaCells[%d]", i)
		if len(c.GetVcpus()) == 0 {
			add(f+".vcpus", "required")
		}
		for j, v := range c.GetVcpus() {
			switch other, ok := in[v]; {
			case int(v) >= n:
				add(fmt.Sprintf("%s.vcpus[%d]", f, j), "vCPU %d of %d", v, n)
			case ok:
				add(fmt.Sprintf("%s.vcpus[%d]", f, j), "vCPU %d is also in node %d", v, other)
			}
			in[v] = i
		}
		switch m := c.GetMemoryBytes(); {
		case m == 0:
			add(f+".memoryBytes", "required and > 0")
		case page != 0 && m%page != 0:
			add(f+".memoryBytes", "%d is not a multiple of the huge page size %d", m, page)
		}
		total += c.GetMemoryBytes()
	}
	if len(in) != n {
		add("cpu.numaCells", "%d of the %d vCPUs are in a node: every vCPU must be", len(in), n)
	}
	if total != mem.GetGuestBytes() {
		add("cpu.numaCells", "the nodes' memory adds up to %d bytes, the guest memory is %d", total, mem.GetGuestBytes())
	}
}

// NonPCIHostDevices are the host devices of spec that have no PCI address (a device driver's
// device known by its resource and ids, such as a simulated one), as field errors naming each
// by its field path, hostDevices[i]. A hypervisor driver that passes host devices through as
// VFIO PCI functions only (qmp, libvirt) refuses these with the rest of what it cannot honour,
// rather than start the VM without them.
func NonPCIHostDevices(spec *domainv1.DomainSpec) []FieldError {
	var out []FieldError
	for i, h := range spec.GetHostDevices() {
		if h.GetPciAddress() != "" {
			continue
		}
		what := "resource " + strconv.Quote(h.GetResource())
		if d := h.GetDeviceDriver(); d != "" {
			what += " of device driver " + strconv.Quote(d)
		}
		if ids := h.GetDeviceIds(); len(ids) > 0 {
			what += ", ids " + strings.Join(ids, ",")
		}
		out = append(out, FieldError{Field: fmt.Sprintf("hostDevices[%d]", i),
			Detail: fmt.Sprintf("%q (%s) has no PCI address: this driver passes through VFIO PCI functions only", h.GetName(), what)})
	}
	return out
}

// VCPUs is the number of vCPUs the spec asks for (1 when the CPU is not given).
func VCPUs(spec *domainv1.DomainSpec) uint32 {
	cpu := spec.GetCpu()
	return max(cpu.GetSockets(), 1) * max(cpu.GetCores(), 1) * max(cpu.GetThreads(), 1)
}

// validateIncomingDisks checks the disks a migration target serves over NBD
// (incoming_migration.disks_socket_path and disks): the socket as socket_path's, and each disk
// a writable disk of the spec, named once.
func validateIncomingDisks(spec *domainv1.DomainSpec, in *domainv1.IncomingMigration, add func(field, format string, args ...any)) {
	p, names := in.GetDisksSocketPath(), in.GetDisks()
	switch {
	case p == "" && len(names) == 0:
		return
	case p == "":
		add("incomingMigration.disksSocketPath", "required with incomingMigration.disks")
	case len(names) == 0:
		add("incomingMigration.disksSocketPath", "set without incomingMigration.disks to serve on it")
	case !filepath.IsAbs(p):
		add("incomingMigration.disksSocketPath", "must be an absolute path, not %q", p)
	case len(p) > MaxSocketPath:
		add("incomingMigration.disksSocketPath", "%q is longer than a unix socket path can be (%d bytes)", p, MaxSocketPath)
	case spec.GetRunDir() != "" && !strings.HasPrefix(p, filepath.Clean(spec.GetRunDir())+"/"):
		add("incomingMigration.disksSocketPath", "%q is not in runDir %q", p, spec.GetRunDir())
	case filepath.Clean(p) == filepath.Clean(in.GetSocketPath()):
		add("incomingMigration.disksSocketPath", "%q is the migration stream's socketPath", p)
	}
	disks := map[string]*domainv1.Disk{}
	for _, d := range spec.GetDisks() {
		disks[d.GetName()] = d
	}
	seen := map[string]bool{}
	for i, n := range names {
		f := fmt.Sprintf("incomingMigration.disks[%d]", i)
		d, ok := disks[n]
		switch {
		case !ok:
			add(f, "%q is not a disk of the spec", n)
		case seen[n]:
			add(f, "%q is named twice", n)
		case d.GetReadOnly() || d.GetDevice() != domainv1.DiskDevice_DISK_DEVICE_DISK:
			add(f, "disk %q is read-only, a CD-ROM or a LUN: only writable disks are copied", n)
		}
		seen[n] = true
	}
}
