package qmp

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

func baseSpec() *domainv1.DomainSpec {
	return &domainv1.DomainSpec{Id: "vm1", Name: "ns/vm1", Memory: &domainv1.Memory{GuestBytes: 64 << 20}}
}

func baseEnv() HostEnv {
	return HostEnv{Accel: AccelTCG, RunDir: "/run/vm1", OVMF: DefaultOVMF}
}

// hasArgs reports whether want appears in args as a contiguous run.
func hasArgs(args []string, want ...string) bool {
	for i := 0; i+len(want) <= len(args); i++ {
		if slices.Equal(args[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

func TestBuildArgs(t *testing.T) {
	type tc struct {
		name  string
		spec  func(*domainv1.DomainSpec)
		env   func(*HostEnv)
		want  [][]string // each a contiguous run of arguments
		not   []string   // arguments that must not appear
		files []string
		vars  string
		// errors: the code and the field paths the message names
		code   codes.Code
		fields []string
	}
	disk := func(d *domainv1.Disk) func(*domainv1.DomainSpec) {
		return func(s *domainv1.DomainSpec) { s.Disks = append(s.Disks, d) }
	}
	nic := func(n *domainv1.NIC) func(*domainv1.DomainSpec) {
		return func(s *domainv1.DomainSpec) { s.Nics = append(s.Nics, n) }
	}
	const mac = "52:54:00:12:34:56"
	cases := []tc{
		{
			name: "defaults",
			want: [][]string{
				{"-name", "guest=ns/vm1,debug-threads=on"},
				{"-machine", "q35"}, {"-accel", "tcg"}, {"-cpu", "max"},
				{"-smp", "1,sockets=1,cores=1,threads=1"}, {"-m", "64M"},
				{"-nodefaults", "-no-user-config", "-display", "none", "-S"},
				{"-pidfile", "/run/vm1/qemu.pid"},
				{"-chardev", "socket,id=qmp,path=/run/vm1/qmp.sock,server=on,wait=off", "-mon", "chardev=qmp,mode=control"},
				{"-chardev", "socket,id=serial0,path=/run/vm1/serial.sock,server=on,wait=off", "-serial", "chardev:serial0"},
				{"-device", "pvpanic"}, {"-action", "panic=shutdown"},
				{"-device", "virtio-serial-pci-non-transitional,id=virtio-serial0",
					"-chardev", "socket,id=qga0,path=/run/vm1/qga.sock,server=on,wait=off",
					"-device", "virtserialport,bus=virtio-serial0.0,chardev=qga0,name=org.qemu.guest_agent.0"},
				{"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"},
			},
			not: []string{"-uuid", "-smbios", "-vnc", "-kernel", "-netdev", "-blockdev", "-object"},
		},
		{
			name: "name defaults to id, commas escaped",
			spec: func(s *domainv1.DomainSpec) { s.Name = ""; s.Id = "a,b" },
			want: [][]string{{"-name", "guest=a,,b,debug-threads=on"}},
		},
		{
			name: "tcg translation cache bounded",
			env:  func(e *HostEnv) { e.TCGTranslationCacheMiB = 64 },
			want: [][]string{{"-accel", "tcg,tb-size=64"}},
		},
		{
			name: "tcg translation cache and a thread per pinned vCPU",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}}}
			},
			env:  func(e *HostEnv) { e.TCGTranslationCacheMiB = 32 },
			want: [][]string{{"-accel", "tcg,thread=multi,tb-size=32"}},
		},
		{
			name: "kvm has no translation cache",
			env:  func(e *HostEnv) { e.Accel = AccelKVM; e.TCGTranslationCacheMiB = 64 },
			want: [][]string{{"-accel", "kvm"}},
		},
		{
			name: "kvm default cpu is host",
			env:  func(e *HostEnv) { e.Accel = AccelKVM },
			want: [][]string{{"-accel", "kvm"}, {"-cpu", "host"}},
		},
		{
			name: "kvm host-passthrough",
			spec: func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "host-passthrough"} },
			env:  func(e *HostEnv) { e.Accel = AccelKVM },
			want: [][]string{{"-cpu", "host"}},
		},
		{
			name: "pinned vCPUs under tcg: a thread per vCPU",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 2, Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 0}}}
			},
			want: [][]string{{"-accel", "tcg,thread=multi"}, {"-smp", "2,sockets=2,cores=1,threads=1"}},
		},
		{
			name: "pinned vCPUs under kvm: a thread per vCPU anyway",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}, EmulatorHostCpus: []uint32{0}}}
			},
			env:  func(e *HostEnv) { e.Accel = AccelKVM },
			want: [][]string{{"-accel", "kvm"}},
		},
		{
			name: "NUMA nodes on huge pages, bound to host nodes",
			spec: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 128 << 20, Hugepages: &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/huge"}}
				s.Cpu = &domainv1.CPU{Sockets: 3, Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 2, 3}}, NumaCells: []*domainv1.NUMACell{
					{Vcpus: []uint32{0, 2}, MemoryBytes: 64 << 20, HostNodes: []uint32{0}},
					{Vcpus: []uint32{1}, MemoryBytes: 64 << 20, HostNodes: []uint32{1, 3}},
				}}
			},
			want: [][]string{
				{"-machine", "q35"}, {"-m", "128M"},
				{"-object", "memory-backend-file,id=mem-numa0,size=67108864,mem-path=/huge,prealloc=on,share=off,host-nodes=0,policy=bind",
					"-numa", "node,nodeid=0,memdev=mem-numa0,cpus=0,cpus=2"},
				{"-object", "memory-backend-file,id=mem-numa1,size=67108864,mem-path=/huge,prealloc=on,share=off,host-nodes=1,host-nodes=3,policy=bind",
					"-numa", "node,nodeid=1,memdev=mem-numa1,cpus=1"},
			},
			not: []string{"memory-backend-file,id=mem0,size=128M,mem-path=/huge,prealloc=on,share=off", "q35,memory-backend=mem0"},
		},
		{
			name: "a NUMA node in ordinary memory",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{NumaCells: []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: 64 << 20}}}
			},
			want: [][]string{{"-object", "memory-backend-ram,id=mem-numa0,size=67108864", "-numa", "node,nodeid=0,memdev=mem-numa0,cpus=0"}},
		},
		{
			name: "tcg host-model is max",
			spec: func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "host-model"} },
			want: [][]string{{"-cpu", "max"}},
		},
		{
			name:   "tcg rejects host-passthrough",
			spec:   func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "host-passthrough"} },
			code:   codes.InvalidArgument,
			fields: []string{"cpu.model"},
		},
		{
			name: "named model offered",
			spec: func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "Skylake-Client"} },
			env:  func(e *HostEnv) { e.CPUModels = []string{"max", "Skylake-Client"} },
			want: [][]string{{"-cpu", "Skylake-Client"}},
		},
		{
			name:   "named model not offered",
			spec:   func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "Nehalem-9000"} },
			env:    func(e *HostEnv) { e.CPUModels = []string{"max"} },
			code:   codes.InvalidArgument,
			fields: []string{"cpu.model"},
		},
		{
			name:   "model with option syntax",
			spec:   func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Model: "max,+vmx"} },
			code:   codes.InvalidArgument,
			fields: []string{"cpu.model"},
		},
		{
			name: "topology",
			spec: func(s *domainv1.DomainSpec) { s.Cpu = &domainv1.CPU{Sockets: 2, Cores: 3, Threads: 2} },
			want: [][]string{{"-smp", "12,sockets=2,cores=3,threads=2"}},
		},
		{
			name: "memory not a MiB multiple",
			spec: func(s *domainv1.DomainSpec) { s.Memory.GuestBytes = 1000000000 },
			want: [][]string{{"-m", "1000000000B"}},
		},
		{
			name: "guest memory on 2 MiB huge pages",
			spec: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 128 << 20, Hugepages: &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "/var/run/kubevisor-private/hugepages"}}
			},
			want: [][]string{
				{"-machine", "q35,memory-backend=mem0"}, {"-m", "128M"},
				{"-object", "memory-backend-file,id=mem0,size=128M,mem-path=/var/run/kubevisor-private/hugepages,prealloc=on,share=off"},
			},
		},
		{
			name: "guest memory on 1 GiB huge pages, after the machine's features and pflash",
			spec: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 2 << 30, Hugepages: &domainv1.Hugepages{PageSizeBytes: 1 << 30, Path: "/huge,1G"}}
				s.Features = &domainv1.Features{Smm: domainv1.Toggle_TOGGLE_ON}
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}}
			},
			want: [][]string{
				{"-machine", "q35,smm=on,pflash0=pflash0,pflash1=pflash1,memory-backend=mem0"}, {"-m", "2048M"},
				{"-object", "memory-backend-file,id=mem0,size=2048M,mem-path=/huge,,1G,prealloc=on,share=off"},
			},
			vars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
		},
		{
			name: "huge pages of a size x86_64 lacks",
			spec: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 64 << 20, Hugepages: &domainv1.Hugepages{PageSizeBytes: 4 << 20, Path: "/huge"}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"memory.hugepages.pageSizeBytes"},
		},
		{
			name: "guest memory not whole huge pages, relative hugetlbfs path",
			spec: func(s *domainv1.DomainSpec) {
				s.Memory = &domainv1.Memory{GuestBytes: 65 << 20, Hugepages: &domainv1.Hugepages{PageSizeBytes: 2 << 20, Path: "huge"}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"memory.guestBytes", "memory.hugepages.path"},
		},
		{
			name: "uuid and smbios serial",
			spec: func(s *domainv1.DomainSpec) {
				s.Uuid = "6a1f2b3c-1111-4222-8333-444455556666"
				s.Firmware = &domainv1.Firmware{Serial: "abc,def"}
			},
			want: [][]string{{"-uuid", "6a1f2b3c-1111-4222-8333-444455556666"}, {"-smbios", "type=1,serial=abc,,def"}},
		},
		{
			name:   "bad uuid",
			spec:   func(s *domainv1.DomainSpec) { s.Uuid = "not-a-uuid" },
			code:   codes.InvalidArgument,
			fields: []string{"uuid"},
		},
		{
			name: "machine pc",
			spec: func(s *domainv1.DomainSpec) { s.Machine = &domainv1.Machine{Type: "pc-i440fx-7.2"} },
			want: [][]string{{"-machine", "pc-i440fx-7.2"}},
		},
		{
			name:   "unknown machine",
			spec:   func(s *domainv1.DomainSpec) { s.Machine = &domainv1.Machine{Type: "virt"} },
			code:   codes.InvalidArgument,
			fields: []string{"machine.type"},
		},
		{
			name:   "machine not offered by this qemu",
			spec:   func(s *domainv1.DomainSpec) { s.Machine = &domainv1.Machine{Type: "pc-q35-99.0"} },
			env:    func(e *HostEnv) { e.MachineTypes = []string{"q35", "pc-q35-7.2"} },
			code:   codes.InvalidArgument,
			fields: []string{"machine.type"},
		},
		{
			name: "virtio qcow2 cache none boot order",
			spec: disk(&domainv1.Disk{Name: "root", Path: "/img/root,1.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Cache: "none", BootOrder: 1, Serial: "root-1"}),
			want: [][]string{
				{"-blockdev", "driver=file,node-name=file-disk0,filename=/img/root,,1.qcow2,cache.direct=on"},
				{"-blockdev", "driver=qcow2,node-name=disk0,file=file-disk0"},
				{"-device", "virtio-blk-pci-non-transitional,drive=disk0,id=ua-disk0,write-cache=on,serial=root-1,bootindex=1"},
			},
		},
		{
			name: "raw is the default format, read-only virtio",
			spec: disk(&domainv1.Disk{Name: "d", Path: "/img/d.raw", ReadOnly: true}),
			want: [][]string{
				{"-blockdev", "driver=file,node-name=file-disk0,filename=/img/d.raw,read-only=on"},
				{"-blockdev", "driver=raw,node-name=disk0,file=file-disk0,read-only=on"},
				{"-device", "virtio-blk-pci-non-transitional,drive=disk0,id=ua-disk0"},
			},
		},
		{
			name: "block device",
			spec: disk(&domainv1.Disk{Name: "d", Path: "/dev/sdb", Cache: "writethrough"}),
			env:  func(e *HostEnv) { e.BlockDevices = map[string]bool{"/dev/sdb": true} },
			want: [][]string{
				{"-blockdev", "driver=host_device,node-name=file-disk0,filename=/dev/sdb"},
				{"-device", "virtio-blk-pci-non-transitional,drive=disk0,id=ua-disk0,write-cache=off"},
			},
		},
		{
			name: "sata disk and cdrom on q35",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_SATA, Cache: "writeback"},
					{Name: "cd", Path: "/img/cd.iso", Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, BootOrder: 2},
				}
			},
			want: [][]string{
				{"-device", "ide-hd,bus=ide.0,drive=disk0,id=ua-disk0,write-cache=on"},
				{"-blockdev", "driver=file,node-name=file-disk1,filename=/img/cd.iso,read-only=on"},
				{"-blockdev", "driver=raw,node-name=disk1,file=file-disk1,read-only=on"},
				{"-device", "ide-cd,bus=ide.1,drive=disk1,id=ua-disk1,bootindex=2"},
			},
			not: []string{"ich9-ahci,id=sata0"},
		},
		{
			name: "sata on pc gets an AHCI controller first",
			spec: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_SATA}}
			},
			want: [][]string{{"-device", "ich9-ahci,id=sata0", "-blockdev"}, {"-device", "ide-hd,bus=sata0.0,drive=disk0,id=ua-disk0"}},
		},
		{
			name: "scsi disk and cdrom",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_SCSI},
					{Name: "b", Path: "/img/b", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM},
				}
			},
			want: [][]string{
				{"-device", "virtio-scsi-pci-non-transitional,id=scsi0", "-blockdev"},
				{"-device", "scsi-hd,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=disk0,id=ua-disk0"},
				{"-device", "scsi-cd,bus=scsi0.0,channel=0,scsi-id=0,lun=1,drive=disk1,id=ua-disk1"},
			},
		},
		{
			name: "lun: scsi-block on the device, sharing scsi0 with a scsi disk",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_SCSI},
					{Name: "l", Path: "/dev/sdb", Device: domainv1.DiskDevice_DISK_DEVICE_LUN, BootOrder: 2, Cache: "none", ErrorPolicy: "report"},
				}
			},
			env: func(e *HostEnv) { e.SGIO = map[string]string{"/dev/sdb": ""} },
			want: [][]string{
				{"-device", "virtio-scsi-pci-non-transitional,id=scsi0", "-blockdev"},
				{"-device", "scsi-hd,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=disk0,id=ua-disk0"},
				{"-blockdev", "driver=host_device,node-name=file-disk1,filename=/dev/sdb,cache.direct=on",
					"-device", "scsi-block,bus=scsi0.0,channel=0,scsi-id=0,lun=1,drive=file-disk1,id=ua-disk1,werror=report,rerror=report,bootindex=2"},
			},
			not: []string{"node-name=disk1", "write-cache"},
		},
		{
			name: "lun readonly and shareable",
			spec: disk(&domainv1.Disk{Name: "l", Path: "/dev/sdb", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_LUN, ReadOnly: true, Shareable: true}),
			env:  func(e *HostEnv) { e.SGIO = map[string]string{"/dev/sdb": ""} },
			want: [][]string{
				{"-blockdev", "driver=host_device,node-name=file-disk0,filename=/dev/sdb,read-only=on,locking=off",
					"-device", "scsi-block,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=file-disk0,id=ua-disk0,share-rw=on"},
			},
		},
		{
			name: "lun on a device that does not take SG_IO",
			spec: disk(&domainv1.Disk{Name: "l", Path: "/dev/loop0", Device: domainv1.DiskDevice_DISK_DEVICE_LUN}),
			env: func(e *HostEnv) {
				e.SGIO = map[string]string{"/dev/loop0": "ioctl SG_GET_VERSION_NUM: inappropriate ioctl for device"}
			},
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].path"},
		},
		{
			name:   "lun whose device was not checked",
			spec:   disk(&domainv1.Disk{Name: "l", Path: "/dev/sdb", Device: domainv1.DiskDevice_DISK_DEVICE_LUN}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].path"},
		},
		{
			name: "lun: what scsi-block does not have",
			spec: disk(&domainv1.Disk{Name: "l", Path: "/dev/sdb", Device: domainv1.DiskDevice_DISK_DEVICE_LUN, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO,
				Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Serial: "s", LogicalBlockSize: 4096, Cache: "writeback", Queues: 2}),
			env:    func(e *HostEnv) { e.SGIO = map[string]string{"/dev/sdb": ""} },
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].bus", "disks[0].format", "disks[0].serial", "disks[0].logicalBlockSize", "disks[0].cache", "disks[0].queues"},
		},
		{
			name: "usb",
			spec: disk(&domainv1.Disk{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_USB, BootOrder: 1}),
			want: [][]string{{"-device", "qemu-xhci,id=usb0", "-blockdev"}, {"-device", "usb-storage,bus=usb0.0,drive=disk0,id=ua-disk0,bootindex=1"}},
		},
		{
			name:   "virtio cdrom",
			spec:   disk(&domainv1.Disk{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].bus"},
		},
		{
			name:   "usb cdrom",
			spec:   disk(&domainv1.Disk{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_USB, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].bus"},
		},
		{
			name:   "read-only sata disk",
			spec:   disk(&domainv1.Disk{Name: "a", Path: "/img/a", Bus: domainv1.DiskBus_DISK_BUS_SATA, ReadOnly: true}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].readOnly"},
		},
		{
			name:   "unknown cache mode",
			spec:   disk(&domainv1.Disk{Name: "a", Path: "/img/a", Cache: "unsafe"}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].cache"},
		},
		{
			name:   "serial too long",
			spec:   disk(&domainv1.Disk{Name: "a", Path: "/img/a", Serial: strings.Repeat("x", 21)}),
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].serial"},
		},
		{
			name: "too many sata disks",
			spec: func(s *domainv1.DomainSpec) {
				for i := range 7 {
					s.Disks = append(s.Disks, &domainv1.Disk{Name: string(rune('a' + i)), Path: "/img/x", Bus: domainv1.DiskBus_DISK_BUS_SATA})
				}
			},
			code:   codes.InvalidArgument,
			fields: []string{"disks[6].bus"},
		},
		{
			name: "virtio tap by name with vhost, mtu and boot order",
			spec: nic(&domainv1.NIC{Name: "default", TapName: "tap0", Mac: "52:54:00:AB:CD:EF", Mtu: 1400, BootOrder: 2}),
			env:  func(e *HostEnv) { e.VhostNet = true },
			want: [][]string{
				{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no,vhost=on"},
				{"-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=52:54:00:ab:cd:ef,host_mtu=1400,bootindex=2"},
			},
		},
		{
			name: "no vhost without /dev/vhost-net",
			spec: nic(&domainv1.NIC{Name: "default", TapName: "tap0", Mac: mac}),
			want: [][]string{{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no"}},
		},
		{
			name: "e1000 e1000e rtl8139 take no host_mtu or vhost",
			spec: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{
					{Name: "a", TapName: "tap0", Mac: mac, Model: "e1000", Mtu: 1400},
					{Name: "b", TapName: "tap1", Mac: "52:54:00:12:34:57", Model: "e1000e"},
					{Name: "c", TapName: "tap2", Mac: "52:54:00:12:34:58", Model: "rtl8139"},
				}
			},
			env: func(e *HostEnv) { e.VhostNet = true },
			want: [][]string{
				{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no", "-device", "e1000,id=ua-net0,netdev=net0,mac=" + mac},
				{"-device", "e1000e,id=ua-net1,netdev=net1,mac=52:54:00:12:34:57"},
				{"-device", "rtl8139,id=ua-net2,netdev=net2,mac=52:54:00:12:34:58"},
			},
		},
		{
			name: "taps by fd are passed in order",
			spec: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{
					{Name: "a", TapFdPath: "/proc/self/fd/7", Mac: mac},
					{Name: "b", TapName: "tap1", Mac: "52:54:00:12:34:57"},
					{Name: "c", TapFdPath: "/proc/self/fd/9", Mac: "52:54:00:12:34:58"},
				}
			},
			want:  [][]string{{"-netdev", "tap,id=net0,fd=3"}, {"-netdev", "tap,id=net2,fd=4"}},
			files: []string{"/proc/self/fd/7", "/proc/self/fd/9"},
		},
		{
			name: "multi-queue virtio NIC: queues on the tap, mq and 2n+2 vectors on the device",
			spec: nic(&domainv1.NIC{Name: "default", TapName: "tap0", Mac: mac, Queues: 4}),
			env:  func(e *HostEnv) { e.VhostNet = true },
			want: [][]string{{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no,vhost=on,queues=4",
				"-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=" + mac + ",mq=on,vectors=10"}},
		},
		{
			name: "one queue is the single-queue NIC",
			spec: nic(&domainv1.NIC{Name: "default", TapName: "tap0", Mac: mac, Queues: 1}),
			want: [][]string{{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no",
				"-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=" + mac}},
			not: []string{"mq=on"},
		},
		{
			name: "queues on an e1000, on a tap descriptor, and above a tap's 256",
			spec: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{
					{Name: "a", TapName: "tap0", Mac: mac, Model: "e1000", Queues: 2},
					{Name: "b", TapFdPath: "/proc/self/fd/7", Mac: "52:54:00:12:34:57", Queues: 2},
					{Name: "c", TapName: "tap2", Mac: "52:54:00:12:34:58", Queues: 257},
				}
			},
			code:   codes.InvalidArgument,
			fields: []string{"nics[0].queues", "nics[1].queues", "nics[2].queues"},
		},
		{
			name: "virtio devices are modern only by default",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a.img"}, {Name: "b", Path: "/b.img", Bus: domainv1.DiskBus_DISK_BUS_SCSI}}
				s.Nics = []*domainv1.NIC{{Name: "n", TapName: "tap0", Mac: mac}, {Name: "e", TapName: "tap1", Mac: "52:54:00:12:34:57", Model: "e1000"}}
				s.Rng, s.Balloon = &domainv1.RNG{}, &domainv1.Balloon{}
				s.Inputs = []*domainv1.Input{{Name: "t", Type: "tablet", Bus: "virtio"}}
			},
			want: [][]string{
				{"-device", "virtio-blk-pci-non-transitional,drive=disk0,id=ua-disk0"},
				{"-device", "virtio-scsi-pci-non-transitional,id=scsi0"},
				{"-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=" + mac},
				{"-device", "e1000,id=ua-net1,netdev=net1,mac=52:54:00:12:34:57"},
				{"-device", "virtio-rng-pci-non-transitional,rng=rng0,id=rng"},
				{"-device", "virtio-balloon-pci-non-transitional,id=balloon0"},
				{"-device", "virtio-tablet-pci,id=input0"},
			},
		},
		{
			name: "virtio_transitional: every virtio device transitional, but the modern-only input",
			spec: func(s *domainv1.DomainSpec) {
				s.VirtioTransitional = true
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a.img"}, {Name: "b", Path: "/b.img", Bus: domainv1.DiskBus_DISK_BUS_SCSI}}
				s.Nics = []*domainv1.NIC{{Name: "n", TapName: "tap0", Mac: mac, Queues: 2}}
				s.Rng, s.Balloon = &domainv1.RNG{}, &domainv1.Balloon{}
				s.Inputs = []*domainv1.Input{{Name: "t", Type: "tablet", Bus: "virtio"}}
			},
			want: [][]string{
				{"-device", "virtio-blk-pci-transitional,drive=disk0,id=ua-disk0"},
				{"-device", "virtio-scsi-pci-transitional,id=scsi0"},
				{"-device", "virtio-net-pci-transitional,id=ua-net0,netdev=net0,mac=" + mac + ",mq=on,vectors=6"},
				{"-device", "virtio-rng-pci-transitional,rng=rng0,id=rng"},
				{"-device", "virtio-balloon-pci-transitional,id=balloon0"},
				{"-device", "virtio-tablet-pci,id=input0"},
			},
			not: []string{"non-transitional"},
		},
		{
			name:   "unknown nic model",
			spec:   nic(&domainv1.NIC{Name: "a", TapName: "tap0", Mac: mac, Model: "ne2k_pci"}),
			code:   codes.InvalidArgument,
			fields: []string{"nics[0].model"},
		},
		{
			name:   "bad tap name and mtu",
			spec:   nic(&domainv1.NIC{Name: "a", TapName: "tap0,vhost=on", Mac: mac, Mtu: 20}),
			code:   codes.InvalidArgument,
			fields: []string{"nics[0].tapName", "nics[0].mtu"},
		},
		{
			name: "serial socket and vnc from the spec",
			spec: func(s *domainv1.DomainSpec) {
				s.Serial = &domainv1.Serial{SocketPath: "/var/run/vmi/console.sock"}
				s.Vnc = &domainv1.VNC{SocketPath: "/var/run/vmi/vnc.sock"}
			},
			want: [][]string{
				{"-chardev", "socket,id=serial0,path=/var/run/vmi/console.sock,server=on,wait=off"},
				{"-device", "VGA,id=video0", "-vnc", "unix:/var/run/vmi/vnc.sock"},
			},
		},
		{
			name: "virtio entropy device from the host's /dev/urandom",
			spec: func(s *domainv1.DomainSpec) { s.Rng = &domainv1.RNG{} },
			want: [][]string{{"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci-non-transitional,rng=rng0,id=rng"}},
		},
		{
			name: "SMBIOS chassis: the fields set, commas escaped",
			spec: func(s *domainv1.DomainSpec) {
				s.Chassis = &domainv1.Chassis{Manufacturer: "Acme, Inc.", Serial: "c-1", Sku: "sku9"}
			},
			want: [][]string{{"-smbios", "type=3,manufacturer=Acme,, Inc.,serial=c-1,sku=sku9"}},
		},
		{
			name: "features on the machine: acpi off (pc), smm off",
			spec: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_OFF, Smm: domainv1.Toggle_TOGGLE_OFF}
			},
			want: [][]string{{"-machine", "pc,acpi=off,smm=off"}, {"-cpu", "max"}},
		},
		{
			name: "features on the machine: acpi on, smm on",
			spec: func(s *domainv1.DomainSpec) {
				s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_ON, Smm: domainv1.Toggle_TOGGLE_ON}
			},
			want: [][]string{{"-machine", "q35,acpi=on,smm=on"}},
		},
		{
			name:   "acpi off on q35",
			spec:   func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_OFF} },
			code:   codes.InvalidArgument,
			fields: []string{"features.acpi"},
		},
		{
			name: "features under KVM: Hyper-V, kvm hidden, pvspinlock, eoi",
			spec: func(s *domainv1.DomainSpec) {
				s.Features = &domainv1.Features{
					ApicEoi: true, KvmHidden: true, Pvspinlock: domainv1.Toggle_TOGGLE_OFF,
					Hyperv:                []string{"relaxed", "spinlocks", "vpindex", "synic", "stimer", "vendor-id"},
					HypervSpinlockRetries: 8191, HypervVendorId: "KubevisorHv",
				}
				s.Clock = &domainv1.Clock{Hyperv: domainv1.Toggle_TOGGLE_ON, Kvm: domainv1.Toggle_TOGGLE_OFF}
			},
			env: func(e *HostEnv) { e.Accel = AccelKVM },
			want: [][]string{{"-cpu", "host,kvm-pv-eoi=on,kvm=off,kvm-pv-unhalt=off,hv-relaxed=on,hv-spinlocks=0x1fff," +
				"hv-vpindex=on,hv-synic=on,hv-stimer=on,hv-vendor-id=KubevisorHv,kvmclock=off,hv-time=on"}},
		},
		{
			name:   "Hyper-V enlightenments when emulated",
			spec:   func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{Hyperv: []string{"relaxed"}} },
			code:   codes.FailedPrecondition,
			fields: []string{"features.hyperv"},
		},
		{
			name:   "kvm hidden when emulated",
			spec:   func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{KvmHidden: true} },
			code:   codes.FailedPrecondition,
			fields: []string{"features.kvmHidden"},
		},
		{
			name: "secure boot with smm off",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true}}}
				s.Features = &domainv1.Features{Smm: domainv1.Toggle_TOGGLE_OFF}
			},
			code:   codes.InvalidArgument,
			fields: []string{"features.smm"},
		},
		{
			name: "clock in a time zone, timers",
			spec: func(s *domainv1.DomainSpec) {
				s.Clock = &domainv1.Clock{Timezone: "Asia/Kolkata", Hpet: domainv1.Toggle_TOGGLE_OFF, Pit: domainv1.Toggle_TOGGLE_ON,
					RtcTrack: "guest", RtcTickPolicy: "catchup", Kvm: domainv1.Toggle_TOGGLE_OFF}
			},
			env: func(e *HostEnv) { e.Now = func() time.Time { return time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC) } },
			want: [][]string{
				{"-machine", "q35,hpet=off,pit=on"},
				{"-rtc", "base=2026-12-02T15:30:00,clock=vm,driftfix=slew"},
				{"-cpu", "max"},
			},
		},
		{
			name: "clock: utc offset",
			spec: func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{UtcOffsetSeconds: -5400} },
			env:  func(e *HostEnv) { e.Now = func() time.Time { return time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC) } },
			want: [][]string{{"-rtc", "base=2026-12-02T08:30:00"}},
		},
		{
			name:   "clock: unknown zone",
			spec:   func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{Timezone: "Mars/Olympus"} },
			code:   codes.InvalidArgument,
			fields: []string{"clock.timezone"},
		},
		{
			name:   "clock: PIT tick policy when emulated",
			spec:   func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{PitTickPolicy: "delay"} },
			code:   codes.FailedPrecondition,
			fields: []string{"clock.pitTickPolicy"},
		},
		{
			name: "clock: PIT tick policy under KVM",
			spec: func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{PitTickPolicy: "discard"} },
			env:  func(e *HostEnv) { e.Accel = AccelKVM },
			want: [][]string{{"-global", "kvm-pit.lost_tick_policy=discard"}},
			not:  []string{"-rtc"},
		},
		{
			name: "inputs on usb (one controller with a usb disk) and virtio",
			spec: func(s *domainv1.DomainSpec) {
				s.Inputs = []*domainv1.Input{{Name: "t", Type: "tablet", Bus: "usb"}, {Name: "k", Type: "keyboard", Bus: "usb"},
					{Name: "vt", Type: "tablet", Bus: "virtio"}, {Name: "vk", Type: "keyboard", Bus: "virtio"}}
				s.Disks = []*domainv1.Disk{{Name: "u", Path: "/u.img", Bus: domainv1.DiskBus_DISK_BUS_USB}}
			},
			want: [][]string{
				{"-device", "usb-tablet,id=input0,bus=usb0.0"}, {"-device", "usb-kbd,id=input1,bus=usb0.0"},
				{"-device", "virtio-tablet-pci,id=input2"}, {"-device", "virtio-keyboard-pci,id=input3"},
			},
		},
		{
			name: "disk options: native I/O, its own I/O thread, block sizes, shared, error policy",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/a.img", Cache: "none", Io: "native", DedicatedIothread: true, LogicalBlockSize: 4096, PhysicalBlockSize: 4096,
						Shareable: true, ErrorPolicy: "enospace"},
					{Name: "b", Path: "/b.img", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Io: "threads", ErrorPolicy: "stop"},
				}
			},
			want: [][]string{
				{"-object", "iothread,id=iothread-disk0"},
				{"-blockdev", "driver=file,node-name=file-disk0,filename=/a.img,cache.direct=on,aio=native,locking=off"},
				{"-device", "virtio-blk-pci-non-transitional,iothread=iothread-disk0,drive=disk0,id=ua-disk0,logical_block_size=4096,physical_block_size=4096,share-rw=on,werror=enospc,rerror=report,write-cache=on"},
				{"-blockdev", "driver=file,node-name=file-disk1,filename=/b.img,aio=threads"},
				{"-device", "scsi-hd,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=disk1,id=ua-disk1,werror=stop,rerror=stop"},
			},
		},
		{
			name: "disk options the devices cannot take",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/a.img", Io: "native", LogicalBlockSize: 1000},
					{Name: "b", Path: "/b.iso", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, DedicatedIothread: true, ErrorPolicy: "report"},
				}
			},
			code:   codes.InvalidArgument,
			fields: []string{"disks[0].io", "disks[0].logicalBlockSize", "disks[1].dedicatedIothread", "disks[1].errorPolicy"},
		},
		{
			name: "cpu features: on, off, enforced when one is required",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "aes", Policy: "forbid"}, {Name: "popcnt", Policy: "require"},
					{Name: "pcid", Policy: "optional"}, {Name: "x2apic", Policy: "disable"}}}
			},
			env:  func(e *HostEnv) { e.CPUFlags = []string{"aes", "popcnt", "pcid", "x2apic"} },
			want: [][]string{{"-cpu", "max,aes=off,popcnt=on,pcid=on,x2apic=off,enforce"}},
		},
		{
			name: "cpu features without one required: no enforce",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "pcid", Policy: "force"}}}
			},
			want: [][]string{{"-cpu", "max,pcid=on"}},
		},
		{
			name: "cpu features this QEMU does not know",
			spec: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "warp-drive", Policy: "require"}, {Name: "aes", Policy: "maybe"}, {Name: "a,b", Policy: "force"}}}
			},
			env:    func(e *HostEnv) { e.CPUFlags = []string{"aes"} },
			code:   codes.InvalidArgument,
			fields: []string{"cpu.features[0].name", "cpu.features[1].policy", "cpu.features[2].name"},
		},
		{
			name: "a NIC at a PCI address goes first",
			spec: func(s *domainv1.DomainSpec) {
				s.Vnc = &domainv1.VNC{SocketPath: "/run/vm1/vnc.sock"}
				s.Nics = []*domainv1.NIC{
					{Name: "a", TapName: "tap0", Mac: "52:54:00:00:00:01"},
					{Name: "b", TapName: "tap1", Mac: "52:54:00:00:00:02", PciAddress: "0000:00:1f.7", LinkDown: true},
				}
			},
			want: [][]string{
				{"-netdev", "tap,id=net1,ifname=tap1,script=no,downscript=no", "-device", "virtio-net-pci-non-transitional,id=ua-net1,netdev=net1,mac=52:54:00:00:00:02,bus=pcie.0,addr=0x1f.0x7",
					"-device", "VGA,id=video0"},
				{"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no", "-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=52:54:00:00:00:01"},
			},
		},
		{
			name: "a NIC's ACPI index on pc",
			spec: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Nics = []*domainv1.NIC{{Name: "a", TapName: "tap0", Mac: "52:54:00:00:00:01", PciAddress: "0000:00:10.0", AcpiIndex: 7}}
			},
			want: [][]string{{"-device", "virtio-net-pci-non-transitional,id=ua-net0,netdev=net0,mac=52:54:00:00:00:01,bus=pci.0,addr=0x10.0x0,acpi-index=7"}},
		},
		{
			name: "a NIC's ACPI index on q35",
			spec: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "a", TapName: "tap0", Mac: "52:54:00:00:00:01", AcpiIndex: 7}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"nics[0].acpiIndex"},
		},
		{
			name: "a NIC address off the root bus",
			spec: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "a", TapName: "tap0", Mac: "52:54:00:00:00:01", PciAddress: "0000:81:01.0", AcpiIndex: 20000}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"nics[0].pciAddress", "nics[0].acpiIndex"},
		},
		{
			name: "sound: ich9 and its codec on a silent backend",
			spec: func(s *domainv1.DomainSpec) { s.Sound = &domainv1.Sound{Name: "s", Model: "ich9"} },
			want: [][]string{{"-audiodev", "none,id=audio0", "-device", "ich9-intel-hda,id=sound0", "-device", "hda-duplex,id=sound0-codec0,bus=sound0.0,audiodev=audio0"}},
		},
		{
			name: "BIOS output on the serial console",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: true}}}
			},
			want: [][]string{{"-machine", "q35,graphics=off"}},
		},
		{
			name: "sound: ac97",
			spec: func(s *domainv1.DomainSpec) { s.Sound = &domainv1.Sound{Name: "s", Model: "ac97"} },
			want: [][]string{{"-audiodev", "none,id=audio0", "-device", "AC97,id=sound0,audiodev=audio0"}},
		},
		{
			name: "pool I/O threads: each created once, a dedicated one beside them",
			spec: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a.img", Iothread: "iothread0"}, {Name: "b", Path: "/b.img", Iothread: "iothread0"},
					{Name: "c", Path: "/c.img", DedicatedIothread: true, Iothread: "iothread0"}}
			},
			want: [][]string{
				{"-object", "iothread,id=iothread0", "-blockdev"},
				{"-device", "virtio-blk-pci-non-transitional,iothread=iothread0,drive=disk0,id=ua-disk0"},
				{"-device", "virtio-blk-pci-non-transitional,iothread=iothread0,drive=disk1,id=ua-disk1"},
				{"-object", "iothread,id=iothread-disk2"},
				{"-device", "virtio-blk-pci-non-transitional,iothread=iothread-disk2,drive=disk2,id=ua-disk2"},
			},
		},
		{
			name: "virtio disk queues",
			spec: func(s *domainv1.DomainSpec) { s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a.img", Queues: 4}} },
			want: [][]string{{"-device", "virtio-blk-pci-non-transitional,num-queues=4,drive=disk0,id=ua-disk0"}},
		},
		{
			name: "sound model and queues the driver cannot give",
			spec: func(s *domainv1.DomainSpec) {
				s.Sound = &domainv1.Sound{Name: "s", Model: "sb16"}
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a.img", Bus: domainv1.DiskBus_DISK_BUS_SCSI, Queues: 2}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"sound.model", "disks[0].queues"},
		},
		{
			name: "watchdog and balloon",
			spec: func(s *domainv1.DomainSpec) {
				s.Watchdog = &domainv1.Watchdog{Name: "wd", Model: "i6300esb", Action: "poweroff"}
				s.Balloon = &domainv1.Balloon{}
			},
			want: [][]string{{"-device", "i6300esb,id=watchdog0", "-action", "watchdog=poweroff"}, {"-device", "virtio-balloon-pci-non-transitional,id=balloon0"}},
		},
		{
			name: "platform values the driver does not know",
			spec: func(s *domainv1.DomainSpec) {
				s.Inputs = []*domainv1.Input{{Name: "m", Type: "mouse", Bus: "ps2"}}
				s.Watchdog = &domainv1.Watchdog{Model: "diag288", Action: "pause"}
				s.Clock = &domainv1.Clock{RtcTrack: "moon", RtcTickPolicy: "merge"}
			},
			code:   codes.InvalidArgument,
			fields: []string{"inputs[0]", "watchdog.model", "watchdog.action", "clock.rtcTrack", "clock.rtcTickPolicy"},
		},
		{
			name: "efi",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}}
			},
			want: [][]string{
				{"-machine", "q35,pflash0=pflash0,pflash1=pflash1"},
				{"-blockdev", "driver=file,node-name=pflash0,read-only=on,filename=/usr/share/OVMF/OVMF_CODE_4M.fd"},
				{"-blockdev", "driver=file,node-name=pflash1,filename=/run/vm1/OVMF_VARS.fd"},
			},
			not:  []string{"-global"},
			vars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
		},
		{
			name: "efi secure boot",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true}}}
			},
			want: [][]string{
				{"-machine", "q35,smm=on,pflash0=pflash0,pflash1=pflash1"},
				{"-blockdev", "driver=file,node-name=pflash0,read-only=on,filename=/usr/share/OVMF/OVMF_CODE_4M.ms.fd"},
				{"-global", "driver=cfi.pflash01,property=secure,value=on"},
			},
			vars: "/usr/share/OVMF/OVMF_VARS_4M.ms.fd",
		},
		{
			name: "secure boot needs q35",
			spec: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true}}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"firmware.efi.secureBoot"},
		},
		{
			name: "efi without OVMF",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}}
			},
			env:    func(e *HostEnv) { e.OVMF = OVMF{} },
			code:   codes.FailedPrecondition,
			fields: []string{"firmware.efi"},
		},
		{
			name: "kernel boot",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
					KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd", Cmdline: "console=ttyS0 quiet",
				}}}
			},
			want: [][]string{{"-kernel", "/boot/vmlinuz", "-initrd", "/boot/initrd", "-append", "console=ttyS0 quiet"}},
			not:  []string{"pflash0"},
		},
		{
			name: "kernel without initrd or cmdline",
			spec: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{KernelPath: "/boot/vmlinuz"}}}
			},
			want: [][]string{{"-kernel", "/boot/vmlinuz"}},
			not:  []string{"-initrd", "-append"},
		},
		{
			name: "host devices",
			spec: func(s *domainv1.DomainSpec) {
				s.HostDevices = []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}}
			},
			want: [][]string{{"-device", "vfio-pci,host=0000:01:00.0,id=hostdev0"}},
		},
		{
			// A device driver's device without a PCI address (a simulated one): refused by its
			// field path, not left out of the VM.
			name: "host device without a PCI address",
			spec: func(s *domainv1.DomainSpec) {
				s.HostDevices = []*domainv1.HostDevice{
					{Name: "gpu", PciAddress: "0000:01:00.0"},
					{Name: "sim", Resource: "example-sim", DeviceDriver: "sim", DeviceIds: []string{"sim-0"}},
				}
			},
			code:   codes.InvalidArgument,
			fields: []string{`hostDevices[1]: "sim" (resource "example-sim" of device driver "sim", ids sim-0) has no PCI address`},
		},
		{
			name:   "socket path too long",
			env:    func(e *HostEnv) { e.RunDir = "/" + strings.Repeat("d", 110) },
			code:   codes.InvalidArgument,
			fields: []string{"runDir"},
		},
		{
			name: "every error is reported",
			spec: func(s *domainv1.DomainSpec) {
				s.Uuid = "x"
				s.Machine = &domainv1.Machine{Type: "isapc"}
				s.Disks = []*domainv1.Disk{{Name: "a", Path: "/a", Cache: "bad"}}
			},
			code:   codes.InvalidArgument,
			fields: []string{"uuid", "machine.type", "disks[0].cache"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec, env := baseSpec(), baseEnv()
			if c.spec != nil {
				c.spec(spec)
			}
			if c.env != nil {
				c.env(&env)
			}
			cl, err := BuildArgs(spec, env)
			if c.code != codes.OK {
				if status.Code(err) != c.code {
					t.Fatalf("err = %v (%s), want %s", err, status.Code(err), c.code)
				}
				for _, f := range c.fields {
					if !strings.Contains(err.Error(), f+":") {
						t.Errorf("error %q does not name %s", err, f)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildArgs: %v", err)
			}
			for _, w := range c.want {
				if !hasArgs(cl.Args, w...) {
					t.Errorf("args lack %q:\n%s", w, strings.Join(cl.Args, " "))
				}
			}
			for _, n := range c.not {
				for _, a := range cl.Args {
					if strings.Contains(a, n) {
						t.Errorf("args have %q (in %q)", n, a)
					}
				}
			}
			if !slices.Equal(cl.ExtraFiles, c.files) {
				t.Errorf("ExtraFiles = %q, want %q", cl.ExtraFiles, c.files)
			}
			if cl.VarsTemplate != c.vars {
				t.Errorf("VarsTemplate = %q, want %q", cl.VarsTemplate, c.vars)
			}
		})
	}
}

func TestRunPaths(t *testing.T) {
	p := RunPaths(baseSpec(), "/r")
	want := Paths{QMP: "/r/qmp.sock", Serial: "/r/serial.sock", PID: "/r/qemu.pid", Log: "/r/qemu.log", Vars: "/r/OVMF_VARS.fd", Agent: "/r/qga.sock",
		TPMState: "/r/tpm", SWTPMLog: "/r/swtpm.log"}
	if p != want {
		t.Fatalf("RunPaths = %+v, want %+v", p, want)
	}
}

func TestBootSectors(t *testing.T) {
	for name, b := range map[string][]byte{"probe": ProbeBootSector(), "echo": EchoBootSector(false), "acpi": EchoBootSector(true)} {
		if len(b) != 512 || b[510] != 0x55 || b[511] != 0xAA {
			t.Errorf("%s: not a 512-byte boot sector with the 0x55AA signature", name)
		}
	}
}

func TestBuildArgsTPM(t *testing.T) {
	withSWTPM := func(e *HostEnv) { e.SWTPM = "/usr/bin/swtpm" }
	swtpmArgs := []string{"socket", "--tpm2", "--tpmstate", "dir=/run/vm1/tpm,mode=0600",
		"--ctrl", "type=unixio,clientfd=3", "--log", "fd=1,level=1", "--terminate"}
	for _, c := range []struct {
		name  string
		spec  func(*domainv1.DomainSpec)
		env   func(*HostEnv)
		want  []string
		fd    int
		files []string
		code  codes.Code
	}{
		{
			name: "q35: CRB on the socketpair after the passed files",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm = &domainv1.TPM{}
				s.Nics = []*domainv1.NIC{{Name: "a", TapFdPath: "/proc/self/fd/7", Mac: "52:54:00:12:34:56"}}
			},
			env:   withSWTPM,
			want:  []string{"-chardev", "socket,id=chrtpm,fd=4", "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-crb,tpmdev=tpm0,id=tpm"},
			fd:    4,
			files: []string{"/proc/self/fd/7"},
		},
		{
			name: "pc: TIS",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm = &domainv1.TPM{}
				s.Machine = &domainv1.Machine{Type: "pc"}
			},
			env:  withSWTPM,
			want: []string{"-chardev", "socket,id=chrtpm,fd=3", "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0,id=tpm"},
			fd:   3,
		},
		{
			name: "no swtpm on the node",
			spec: func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
			env:  func(e *HostEnv) { e.SWTPMReason = "swtpm not found" },
			code: codes.FailedPrecondition,
		},
		{
			name: "no tpm asked for",
			env:  withSWTPM,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, env := baseSpec(), baseEnv()
			if c.spec != nil {
				c.spec(spec)
			}
			c.env(&env)
			cl, err := BuildArgs(spec, env)
			if c.code != codes.OK {
				if status.Code(err) != c.code || !strings.Contains(err.Error(), "tpm: swtpm is not usable on this node: swtpm not found") {
					t.Fatalf("err = %v, want %s naming tpm and why", err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.want == nil {
				if cl.TPM != nil || slices.Contains(cl.Args, "-tpmdev") {
					t.Fatalf("a TPM without one asked for: %+v %q", cl.TPM, cl.Args)
				}
				return
			}
			if !hasArgs(cl.Args, c.want...) {
				t.Errorf("args lack %q:\n%s", c.want, strings.Join(cl.Args, " "))
			}
			if cl.TPM == nil || cl.TPM.FD != c.fd || !slices.Equal(cl.TPM.Args, swtpmArgs) {
				t.Errorf("TPM = %+v, want fd %d and swtpm %q", cl.TPM, c.fd, swtpmArgs)
			}
			if !slices.Equal(cl.ExtraFiles, c.files) {
				t.Errorf("ExtraFiles = %q, want %q", cl.ExtraFiles, c.files)
			}
		})
	}
}
