package libvirt

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	golibvirt "libvirt.org/go/libvirt"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// TestExplain: libvirt's and QEMU's refusals of a domain, as libvirt 9.0 and QEMU 7.2 wrote
// them when this driver's domains were refused (the messages are theirs, whole, with only the
// temporary paths and times of the run), placed on the domain spec's fields by the builder's
// record, with the contract's code; and what cannot be placed said so, libvirt's message whole.
func TestExplain(t *testing.T) {
	spec := func(edit func(s *domainv1.DomainSpec)) *domainv1.DomainSpec {
		s := &domainv1.DomainSpec{
			Id: "vm-1", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
			Disks: []*domainv1.Disk{{Name: "boot", Path: "/run/vm/boot.img", ReadOnly: true, BootOrder: 1}},
		}
		if edit != nil {
			edit(s)
		}
		return s
	}
	addDisk := func(d ...*domainv1.Disk) func(*domainv1.DomainSpec) {
		return func(s *domainv1.DomainSpec) { s.Disks = append(s.Disks, d...) }
	}
	for _, tc := range []struct {
		name       string
		edit       func(*domainv1.DomainSpec)
		num        golibvirt.ErrorNumber
		msg        string
		wantFields []string
		wantWhat   string
		wantCode   codes.Code
	}{
		{
			name:       "machine type the emulator does not offer",
			edit:       func(s *domainv1.DomainSpec) { s.Machine = &domainv1.Machine{Type: "pc-q35-99.0"} },
			num:        golibvirt.ERR_CONFIG_UNSUPPORTED,
			msg:        "unsupported configuration: Emulator '/usr/bin/qemu-system-x86_64' does not support machine type 'pc-q35-99.0'",
			wantFields: []string{"machine.type"}, wantCode: codes.InvalidArgument,
		},
		{
			name:       "unknown CPU model",
			edit:       func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "NoSuchCPU"} },
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: Unknown CPU model NoSuchCPU",
			wantFields: []string{"cpu.model"}, wantCode: codes.InvalidArgument,
		},
		{
			name: "unknown CPU feature, the second",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "pcid", Policy: "optional"}, {Name: "nosuchflag", Policy: "require"}}}
			},
			num:        golibvirt.ERR_CONFIG_UNSUPPORTED,
			msg:        "unsupported configuration: unknown CPU feature: nosuchflag",
			wantFields: []string{"cpu.features[1].name"}, wantCode: codes.InvalidArgument,
		},
		{
			name: "vCPUs beyond the machine type's",
			edit: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Cpu = &domainv1.CPU{Sockets: 300}
			},
			num:        golibvirt.ERR_CONFIG_UNSUPPORTED,
			msg:        "unsupported configuration: Maximum CPUs greater than specified machine type limit 255",
			wantFields: []string{"cpu"}, wantCode: codes.InvalidArgument,
		},
		{
			name: "a read-only disk on sata, not the read-only virtio disk nor the cdrom",
			edit: addDisk(
				&domainv1.Disk{Name: "cd", Path: "/run/vm/cd.iso", Bus: domainv1.DiskBus_DISK_BUS_SATA, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM},
				&domainv1.Disk{Name: "ro", Path: "/run/vm/ro.img", Bus: domainv1.DiskBus_DISK_BUS_SATA, ReadOnly: true}),
			num:        golibvirt.ERR_CONFIG_UNSUPPORTED,
			msg:        "unsupported configuration: readonly sata disks are not supported",
			wantFields: []string{"disks[2].readOnly"}, wantWhat: `disk "ro"`, wantCode: codes.InvalidArgument,
		},
		{
			name: "a PCI address given twice",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{
					{Name: "a", TapName: "tapa", Mac: "02:00:00:00:00:01", PciAddress: "0000:00:05.0"},
					{Name: "b", TapName: "tapb", Mac: "02:00:00:00:00:02", PciAddress: "0000:00:05.0"},
				}
			},
			num:        golibvirt.ERR_XML_ERROR,
			msg:        "XML error: Attempted double use of PCI Address 0000:00:05.0",
			wantFields: []string{"nics[0].pciAddress", "nics[1].pciAddress"}, wantCode: codes.InvalidArgument,
		},
		{
			name: "a PCI address beyond the buses",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "a", TapName: "tapa", Mac: "02:00:00:00:00:01", PciAddress: "0000:09:01.0"}}
			},
			num:        golibvirt.ERR_XML_ERROR,
			msg:        "XML error: Invalid PCI address 0000:09:01.0. slot must be <= 0",
			wantFields: []string{"nics[0].pciAddress"}, wantWhat: `interface "a"`, wantCode: codes.InvalidArgument,
		},
		{
			name: "the network driver's tap is gone",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01"}}
			},
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: target managed='no' but specified dev doesn't exist",
			wantFields: []string{"nics[0].tapName"}, wantWhat: `interface "default"`, wantCode: codes.FailedPrecondition,
		},
		{
			name: "a host NUMA node the node does not have",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 2, NumaCells: []*domainv1.NUMACell{
					{Vcpus: []uint32{0}, MemoryBytes: 32 << 20, HostNodes: []uint32{0}},
					{Vcpus: []uint32{1}, MemoryBytes: 32 << 20, HostNodes: []uint32{3, 7}},
				}}
			},
			num:        golibvirt.ERR_CONFIG_UNSUPPORTED,
			msg:        "unsupported configuration: NUMA node 7 is unavailable",
			wantFields: []string{"cpu.numaCells[1].hostNodes"}, wantCode: codes.FailedPrecondition,
		},
		{
			name: "a host CPU the node does not have",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{99}}}
			},
			num:        golibvirt.ERR_SYSTEM_ERROR,
			msg:        "cannot set CPU affinity on process 11071: Invalid argument",
			wantFields: []string{"cpu.pinning"}, wantCode: codes.FailedPrecondition,
		},
		{
			name: "not a kernel",
			edit: func(s *domainv1.DomainSpec) {
				s.Disks = nil
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{KernelPath: "/run/vm/vmlinuz"}}}
			},
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: qemu unexpectedly closed the monitor: qemu: invalid kernel header",
			wantFields: []string{"firmware.kernel.kernelPath"}, wantCode: codes.InvalidArgument,
		},
		{
			name:       "more memory than the guest's physical address bits reach",
			edit:       func(s *domainv1.DomainSpec) { s.Memory.GuestBytes = 8 << 40 },
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: qemu unexpectedly closed the monitor: 2026-12-06T03:24:18.989751Z qemu-system-x86_64: Address space limit 0xffffffffff < 0x9077fffffff phys-bits too low (40)",
			wantFields: []string{"memory.guestBytes"}, wantCode: codes.InvalidArgument,
		},
		{
			name:       "QEMU's format node: the disk of that format",
			edit:       addDisk(&domainv1.Disk{Name: "raw", Path: "/run/vm/raw.img", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2}),
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        `internal error: process exited while connecting to monitor: 2026-12-06T03:25:17.062629Z qemu-system-x86_64: -blockdev {"node-name":"libvirt-1-format","read-only":false,"driver":"qcow2","file":"libvirt-1-storage","backing":null}: Image is not in qcow2 format`,
			wantFields: []string{"disks[1].format"}, wantWhat: `disk "raw"`, wantCode: codes.InvalidArgument,
		},
		{
			name:       "QEMU's device with the properties it names",
			edit:       addDisk(&domainv1.Disk{Name: "raw", Path: "/run/vm/raw.img", LogicalBlockSize: 4096, PhysicalBlockSize: 512}),
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        `internal error: process exited while connecting to monitor: 2026-12-06T03:25:21.199899Z qemu-system-x86_64: -device {"driver":"virtio-blk-pci-non-transitional","bus":"pci.3","addr":"0x0","drive":"libvirt-1-format","id":"ua-disk-raw","logical_block_size":4096,"physical_block_size":512}: logical_block_size > physical_block_size not supported`,
			wantFields: []string{"disks[1].logicalBlockSize", "disks[1].physicalBlockSize"}, wantWhat: `disk "raw"`, wantCode: codes.InvalidArgument,
		},
		{
			name:       "QEMU's device by its id alone",
			edit:       func(s *domainv1.DomainSpec) { s.Machine = &domainv1.Machine{Type: "pc-i440fx-2.0"} },
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        `internal error: qemu unexpectedly closed the monitor: 2026-12-06T03:25:32.907993Z qemu-system-x86_64: -device {"driver":"virtio-blk-pci-non-transitional","bus":"pci.0","addr":"0x3","drive":"libvirt-1-format","id":"ua-disk-boot","bootindex":1}: Please set scsi=off for virtio-blk devices in order to use virtio 1.0`,
			wantFields: []string{"disks[0]"}, wantWhat: `disk "boot"`, wantCode: codes.InvalidArgument,
		},
		{
			name: "an image another process holds",
			edit: addDisk(&domainv1.Disk{Name: "raw", Path: "/run/vm/raw.img", Serial: "same", Shareable: false},
				&domainv1.Disk{Name: "raw2", Path: "/run/vm/raw.img", Serial: "same"}),
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: qemu unexpectedly closed the monitor: 2026-12-06T03:25:34.862243Z qemu-system-x86_64: -device {\"driver\":\"virtio-blk-pci-non-transitional\",\"bus\":\"pci.4\",\"addr\":\"0x0\",\"drive\":\"libvirt-1-format\",\"id\":\"ua-disk-raw2\",\"serial\":\"same\"}: Failed to get \"write\" lock\nIs another process using the image [/run/vm/raw.img]?",
			wantFields: []string{"disks[2]"}, wantWhat: `disk "raw2"`, wantCode: codes.FailedPrecondition,
		},
		{
			name:       "a file the VM's user cannot open, by its path",
			edit:       addDisk(&domainv1.Disk{Name: "data", Path: "/run/vm/d.img"}),
			num:        golibvirt.ERR_INTERNAL_ERROR,
			msg:        "internal error: qemu unexpectedly closed the monitor: qemu-system-x86_64: Could not open '/run/vm/d.img': Permission denied",
			wantFields: []string{"disks[1].path"}, wantWhat: `disk "data"`, wantCode: codes.FailedPrecondition,
		},
		{
			name:     "no field: QEMU said nothing",
			num:      golibvirt.ERR_INTERNAL_ERROR,
			msg:      "internal error: qemu unexpectedly closed the monitor",
			wantCode: codes.Internal,
		},
		{
			name:     "no field: an address the spec did not give",
			num:      golibvirt.ERR_XML_ERROR,
			msg:      "XML error: Invalid PCI address 0000:09:01.0. slot must be <= 0",
			wantCode: codes.InvalidArgument,
		},
		{
			name:     "no field: a name only inside a longer word",
			num:      golibvirt.ERR_INTERNAL_ERROR,
			msg:      "internal error: cannot open /dev/vda1",
			wantCode: codes.Internal,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(tc.edit)
			_, org, err := BuildDomainOrigins(s, Env{Accel: qmp.AccelTCG, Emulator: "/usr/bin/qemu-system-x86_64", Serial: "/run/vm/serial.sock"})
			if err != nil {
				t.Fatal(err)
			}
			r := org.Explain(tc.num, tc.msg)
			if !slices.Equal(r.Fields, tc.wantFields) || r.What != tc.wantWhat || r.Code != tc.wantCode {
				t.Errorf("Explain = fields %q, what %q, code %s; want %q, %q, %s", r.Fields, r.What, r.Code, tc.wantFields, tc.wantWhat, tc.wantCode)
			}
			if !strings.HasSuffix(r.Error(), tc.msg) {
				t.Errorf("error %q does not end with libvirt's message whole", r.Error())
			}
			want := "libvirt refused the domain, naming no field of the domain spec: "
			if len(tc.wantFields) > 0 {
				want = strings.Join(tc.wantFields, ", ") + ": "
			}
			if !strings.HasPrefix(r.Error(), want) {
				t.Errorf("error %q does not start with %q", r.Error(), want)
			}
		})
	}
}

// TestOriginsRecord: the builder records each part it makes from a field, and a part not
// recorded falls back to the device holding it.
func TestOriginsRecord(t *testing.T) {
	s := &domainv1.DomainSpec{
		Id: "vm-1", Memory: &domainv1.Memory{GuestBytes: 64 << 20}, Machine: &domainv1.Machine{Type: "pc"},
		Disks: []*domainv1.Disk{
			{Name: "boot", Path: "/img/boot.img", BootOrder: 1},
			{Name: "data", Path: "/img/data.img", Bus: domainv1.DiskBus_DISK_BUS_SATA, Cache: "none"},
		},
		Nics:   []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01", Mtu: 1400}},
		Inputs: []*domainv1.Input{{Name: "tab", Type: "tablet", Bus: "usb"}},
		Cpu:    &domainv1.CPU{Model: "qemu64", Features: []*domainv1.CPUFeature{{Name: "pcid", Policy: "require"}}},
	}
	_, org, err := BuildDomainOrigins(s, Env{Accel: qmp.AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	for loc, want := range map[string]string{
		"os/type@machine":                           "machine.type",
		"cpu/model":                                 "cpu.model",
		"cpu/feature[pcid]":                         "cpu.features[0].name",
		"devices/disk[ua-disk-boot]/boot":           "disks[0].bootOrder",
		"devices/disk[ua-disk-data]/target@bus":     "disks[1].bus",
		"devices/disk[ua-disk-data]/driver@cache":   "disks[1].cache",
		"devices/disk[ua-disk-data]/address":        "disks[1]",
		"devices/interface[ua-net-default]/mtu":     "nics[0].mtu",
		"devices/interface[ua-net-default]/mac":     "nics[0].mac",
		"devices/input[ua-input-tab]":               "inputs[0]",
		"devices/controller[usb]":                   "",
		"devices/disk[ua-disk-data]/target@dev/odd": "disks[1]",
	} {
		if got, _ := org.field(loc); got != want {
			t.Errorf("field(%s) = %q, want %q", loc, got, want)
		}
	}
	for name, want := range map[string]string{"sda": "devices/disk[ua-disk-data]", "/img/data.img": "devices/disk[ua-disk-data]/source",
		"tap0": "devices/interface[ua-net-default]", "02:00:00:00:00:01": "devices/interface[ua-net-default]"} {
		if got := org.names[name]; !slices.Equal(got, []string{want}) {
			t.Errorf("names[%s] = %q, want %s", name, got, want)
		}
	}
}

func TestWordIn(t *testing.T) {
	for _, tc := range []struct {
		msg, w string
		want   bool
	}{
		{"cannot open 'vda'", "vda", true},
		{"cannot open /dev/vda1", "vda", false},
		{"tap0: no such device", "tap0", true},
		{"device tap0.", "tap0", true},
		{"device tap01", "tap0", false},
		{"Could not open '/img/a.img': Permission denied", "/img/a.img", true},
		{"Could not open '/img/a.img.bak'", "/img/a.img", false},
	} {
		if got := wordIn(tc.msg, tc.w); got != tc.want {
			t.Errorf("wordIn(%q, %q) = %v, want %v", tc.msg, tc.w, got, tc.want)
		}
	}
}
