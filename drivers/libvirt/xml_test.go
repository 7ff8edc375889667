package libvirt

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

func baseSpec() *domainv1.DomainSpec {
	return &domainv1.DomainSpec{
		Id:     "vm-1",
		Memory: &domainv1.Memory{GuestBytes: 256 << 20},
		Disks:  []*domainv1.Disk{{Name: "root", Path: "/img/root.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2}},
	}
}

// TestBuildDomainPlatform: the platform fields become libvirt's elements (want, in the
// marshalled XML), or are refused naming the field (wantField), or are a host precondition
// under emulation (wantPrecondition).
func TestBuildDomainPlatform(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC) }
	tcg := Env{Accel: qmp.AccelTCG, Emulator: "/usr/bin/qemu-system-x86_64", Serial: "/run/s.sock", Now: now}
	kvm := tcg
	kvm.Accel = qmp.AccelKVM
	for _, tc := range []struct {
		name             string
		env              Env
		edit             func(*domainv1.DomainSpec)
		want             []string
		notWant          []string
		wantField        string
		wantPrecondition string
	}{
		{
			name: "NIC options and queues",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01", Queues: 4,
					PciAddress: "0000:00:09.0", AcpiIndex: 7, LinkDown: true}}
			},
			want: []string{`<target dev="tap0" managed="no">`, `<driver queues="4">`, `<link state="down">`, `<acpi index="7">`,
				`<address type="pci" domain="0x0000" bus="0x00" slot="0x09" function="0x0">`},
		},
		{
			name: "NIC queues beyond a tap's",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01", Queues: 257}}
			},
			wantField: "nics[0].queues",
		},
		{
			name: "NIC queues of a model with one",
			edit: func(s *domainv1.DomainSpec) {
				s.Nics = []*domainv1.NIC{{Name: "default", TapName: "tap0", Mac: "02:00:00:00:00:01", Model: "e1000", Queues: 2}}
			},
			wantField: "nics[0].queues",
		},
		{
			name:    "watchdog",
			edit:    func(s *domainv1.DomainSpec) { s.Watchdog = &domainv1.Watchdog{Model: "i6300esb", Action: "shutdown"} },
			want:    []string{`<watchdog model="i6300esb" action="shutdown">`},
			notWant: []string{`qemu-xhci`},
		},
		{
			name:      "watchdog: another model",
			edit:      func(s *domainv1.DomainSpec) { s.Watchdog = &domainv1.Watchdog{Model: "ib700", Action: "reset"} },
			wantField: "watchdog.model",
		},
		{
			name:      "watchdog: another action",
			edit:      func(s *domainv1.DomainSpec) { s.Watchdog = &domainv1.Watchdog{Model: "i6300esb", Action: "dump"} },
			wantField: "watchdog.action",
		},
		{
			name: "inputs on virtio: no USB controller",
			edit: func(s *domainv1.DomainSpec) {
				s.Inputs = []*domainv1.Input{{Name: "t", Type: "tablet", Bus: "virtio"}, {Name: "k", Type: "keyboard", Bus: "virtio"}}
			},
			want: []string{`<input type="tablet" bus="virtio">`, `<input type="keyboard" bus="virtio">`, `<controller type="usb" model="none">`},
		},
		{
			name: "a USB tablet brings an xHCI controller",
			edit: func(s *domainv1.DomainSpec) { s.Inputs = []*domainv1.Input{{Name: "t", Type: "tablet", Bus: "usb"}} },
			want: []string{`<input type="tablet" bus="usb">`, `<controller type="usb" model="qemu-xhci">`},
		},
		{
			name:      "input: a mouse",
			edit:      func(s *domainv1.DomainSpec) { s.Inputs = []*domainv1.Input{{Name: "m", Type: "mouse", Bus: "usb"}} },
			wantField: "inputs[0]",
		},
		{
			name: "sound ich9 to no audio backend",
			edit: func(s *domainv1.DomainSpec) { s.Sound = &domainv1.Sound{Name: "s", Model: "ich9"} },
			want: []string{`<sound model="ich9">`, `<audio id="1"></audio>`, `<audio id="1" type="none">`},
		},
		{
			name:      "sound: another model",
			edit:      func(s *domainv1.DomainSpec) { s.Sound = &domainv1.Sound{Model: "sb16"} },
			wantField: "sound.model",
		},
		{
			name: "chassis beside the system entries",
			edit: func(s *domainv1.DomainSpec) {
				s.Uuid = "11111111-2222-3333-4444-555555555555"
				s.Chassis = &domainv1.Chassis{Manufacturer: "Acme, Inc.", Serial: "c-1", Sku: "sku9"}
			},
			want: []string{`<smbios mode="sysinfo">`, `<entry name="uuid">11111111-2222-3333-4444-555555555555</entry>`,
				`<chassis><entry name="manufacturer">Acme, Inc.</entry><entry name="serial">c-1</entry><entry name="sku">sku9</entry></chassis>`},
			notWant: []string{`name="version"`},
		},
		{
			name: "chassis alone",
			edit: func(s *domainv1.DomainSpec) { s.Chassis = &domainv1.Chassis{Asset: "a-1"} },
			want: []string{`<smbios mode="sysinfo">`, `<sysinfo type="smbios"><chassis><entry name="asset">a-1</entry></chassis></sysinfo>`},
		},
		{
			name: "clock in a zone: its offset at start, from UTC",
			edit: func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{Timezone: "Europe/Paris"} },
			want: []string{`<clock offset="variable" basis="utc" adjustment="7200">`},
		},
		{
			name: "clock offset and timers",
			edit: func(s *domainv1.DomainSpec) {
				s.Clock = &domainv1.Clock{UtcOffsetSeconds: -3600, Hpet: domainv1.Toggle_TOGGLE_OFF, Pit: domainv1.Toggle_TOGGLE_ON,
					RtcTrack: "guest", RtcTickPolicy: "catchup"}
			},
			want: []string{`<clock offset="variable" basis="utc" adjustment="-3600">`, `<timer name="hpet" present="no">`,
				`<timer name="pit" present="yes">`, `<timer name="rtc" track="guest" tickpolicy="catchup">`},
		},
		{
			name: "clock UTC",
			edit: func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{} },
			want: []string{`<clock offset="utc">`},
		},
		{
			name:      "clock: unknown zone",
			edit:      func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{Timezone: "Mars/Olympus"} },
			wantField: "clock.timezone",
		},
		{
			name:      "clock: rtc track",
			edit:      func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{RtcTrack: "boot"} },
			wantField: "clock.rtcTrack",
		},
		{
			name:             "clock: KVM clock emulated",
			edit:             func(s *domainv1.DomainSpec) { s.Clock = &domainv1.Clock{Kvm: domainv1.Toggle_TOGGLE_ON} },
			wantPrecondition: "clock.kvm",
		},
		{
			name: "clock: KVM and Hyper-V clocks under KVM, PIT policy",
			env:  kvm,
			edit: func(s *domainv1.DomainSpec) {
				s.Clock = &domainv1.Clock{Kvm: domainv1.Toggle_TOGGLE_ON, Hyperv: domainv1.Toggle_TOGGLE_ON, PitTickPolicy: "discard"}
			},
			want: []string{`<timer name="kvmclock" present="yes">`, `<timer name="hypervclock" present="yes">`, `<timer name="pit" tickpolicy="discard">`},
		},
		{
			name: "features: acpi on, smm off",
			edit: func(s *domainv1.DomainSpec) {
				s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_ON, Smm: domainv1.Toggle_TOGGLE_OFF}
			},
			want: []string{`<acpi></acpi>`, `<smm state="off">`},
		},
		{
			name: "features: acpi off on pc",
			edit: func(s *domainv1.DomainSpec) {
				s.Machine = &domainv1.Machine{Type: "pc"}
				s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_OFF}
			},
			notWant: []string{`<acpi>`},
		},
		{
			name:      "features: acpi off on q35",
			edit:      func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{Acpi: domainv1.Toggle_TOGGLE_OFF} },
			wantField: "features.acpi",
		},
		{
			name: "features: hardware ones under KVM",
			env:  kvm,
			edit: func(s *domainv1.DomainSpec) {
				s.Features = &domainv1.Features{ApicEoi: true, KvmHidden: true, Pvspinlock: domainv1.Toggle_TOGGLE_OFF,
					Hyperv: []string{"relaxed", "spinlocks", "vendor-id", "stimer-direct"}, HypervVendorId: "KubevisorKV"}
			},
			want: []string{`<apic eoi="on">`, `<kvm><hidden state="on">`, `<pvspinlock state="off">`, `<hyperv mode="custom"><relaxed state="on">`,
				`<spinlocks state="on" retries="4096">`, `<stimer state="on"><direct state="on">`, `<vendor_id state="on" value="KubevisorKV">`},
		},
		{
			name:             "features: Hyper-V emulated",
			edit:             func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{Hyperv: []string{"relaxed"}} },
			wantPrecondition: "features.hyperv",
		},
		{
			name:      "features: unknown Hyper-V enlightenment",
			env:       kvm,
			edit:      func(s *domainv1.DomainSpec) { s.Features = &domainv1.Features{Hyperv: []string{"warp"}} },
			wantField: "features.hyperv",
		},
		{
			name: "cpu features on libvirt's default model",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "aes", Policy: "forbid"}, {Name: "popcnt", Policy: "require"}}}
			},
			want: []string{`<cpu match="exact" mode="custom"><model fallback="forbid">qemu64</model>`,
				`<feature policy="forbid" name="aes">`, `<feature policy="require" name="popcnt">`},
		},
		{
			name: "cpu features on a model",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Model: "Nehalem", Features: []*domainv1.CPUFeature{{Name: "x2apic", Policy: "optional"}}}
			},
			want: []string{`<model fallback="forbid">Nehalem</model>`, `<feature policy="optional" name="x2apic">`},
		},
		{
			name: "cpu features: bad policy",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Features: []*domainv1.CPUFeature{{Name: "aes", Policy: "maybe"}}}
			},
			wantField: "cpu.features[0].policy",
		},
		{
			name: "virtio transitional",
			edit: func(s *domainv1.DomainSpec) {
				s.VirtioTransitional, s.Balloon, s.Rng = true, &domainv1.Balloon{}, &domainv1.RNG{}
			},
			want:    []string{`<memballoon model="virtio-transitional">`, `<rng model="virtio-transitional">`, `<disk type="file" device="disk" model="virtio-transitional">`},
			notWant: []string{`non-transitional`},
		},
		{
			name:    "virtio modern only by default",
			edit:    func(s *domainv1.DomainSpec) { s.Balloon = &domainv1.Balloon{} },
			want:    []string{`<memballoon model="virtio-non-transitional">`, `model="virtio-non-transitional"`},
			notWant: []string{`"virtio-transitional"`},
		},
		{
			name: "tpm: CRB on q35, its state kept across the transient domain's runs",
			edit: func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
			want: []string{`<tpm model="tpm-crb"><backend type="emulator" version="2.0" persistent_state="yes">`,
				`<uuid>` + domainUUID(baseSpec()) + `</uuid>`},
		},
		{
			name: "tpm: TIS on pc",
			edit: func(s *domainv1.DomainSpec) { s.Machine, s.Tpm = &domainv1.Machine{Type: "pc"}, &domainv1.TPM{} },
			want: []string{`<tpm model="tpm-tis">`},
		},
		{
			name:             "tpm: no swtpm on the node",
			env:              Env{Accel: qmp.AccelTCG, Emulator: "/q", SWTPMProblem: "swtpm_setup not found"},
			edit:             func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{} },
			wantPrecondition: "swtpm_setup not found",
		},
		{
			name:      "tpm: persistent without a persistent state directory",
			edit:      func(s *domainv1.DomainSpec) { s.Tpm = &domainv1.TPM{Persistent: true} },
			wantField: "tpm.persistent",
		},
		{
			name:      "persistent state directory that nothing uses",
			edit:      func(s *domainv1.DomainSpec) { s.PersistentStateDir, s.Tpm = "/state/vm", &domainv1.TPM{} },
			wantField: "persistentStateDir",
		},
		{
			name: "efi: the variable store in the run dir",
			env:  withOVMF(tcg),
			edit: func(s *domainv1.DomainSpec) {
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{}}}
			},
			want: []string{`<nvram template="/ovmf/VARS.fd">/run/vm/efi-vars.fd</nvram>`},
		},
		{
			name: "efi: a persistent variable store in the persistent state directory",
			env:  withOVMF(tcg),
			edit: func(s *domainv1.DomainSpec) {
				s.PersistentStateDir = "/state/vm"
				s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{Persistent: true}}}
			},
			want: []string{`<nvram template="/ovmf/VARS.fd">/state/vm/efi/vars.fd</nvram>`},
		},
		{
			name: "the guest agent's channel on a socket in the run dir",
			env:  Env{Accel: qmp.AccelTCG, Emulator: "/q", AgentSocket: "/run/vm/agent.sock"},
			edit: func(s *domainv1.DomainSpec) {},
			want: []string{`<channel type="unix"><source mode="bind" path="/run/vm/agent.sock"></source><target type="virtio" name="org.qemu.guest_agent.0"></target></channel>`,
				`<controller type="virtio-serial" model="virtio-non-transitional">`},
		},
		{
			name: "the guest agent's controller transitional",
			env:  Env{Accel: qmp.AccelTCG, Emulator: "/q", AgentSocket: "/run/vm/agent.sock"},
			edit: func(s *domainv1.DomainSpec) { s.VirtioTransitional = true },
			want: []string{`<controller type="virtio-serial" model="virtio-transitional">`},
		},
		{
			name: "pinning: a CPU per vCPU, the emulator's threads apart",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 2, Threads: 1,
					Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{3, 1}, EmulatorHostCpus: []uint32{0, 2}}}
			},
			want: []string{`<cputune><vcpupin vcpu="0" cpuset="3"></vcpupin><vcpupin vcpu="1" cpuset="1"></vcpupin><emulatorpin cpuset="0,2"></emulatorpin></cputune>`},
		},
		{
			name: "pinning: vCPUs only",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}}}
			},
			want:    []string{`<cputune><vcpupin vcpu="0" cpuset="1"></vcpupin></cputune>`},
			notWant: []string{`emulatorpin`},
		},
		{
			name: "disk options",
			edit: func(s *domainv1.DomainSpec) {
				s.Disks = []*domainv1.Disk{
					{Name: "a", Path: "/img/a", Cache: "none", Io: "native", DedicatedIothread: true, Queues: 4, ErrorPolicy: "enospace",
						LogicalBlockSize: 512, PhysicalBlockSize: 4096},
					{Name: "b", Path: "/img/b", Iothread: "iothread0", Shareable: true, ErrorPolicy: "stop"},
					{Name: "c", Path: "/img/c", Iothread: "iothread0", Io: "threads"},
				}
			},
			want: []string{`<iothreads>2</iothreads>`,
				`<driver name="qemu" type="raw" cache="none" error_policy="enospace" rerror_policy="report" io="native" iothread="1" queues="4">`,
				`<blockio logical_block_size="512" physical_block_size="4096">`,
				`<driver name="qemu" type="raw" error_policy="stop" rerror_policy="stop" iothread="2">`, `<shareable></shareable>`,
				`<driver name="qemu" type="raw" io="threads" iothread="2">`},
		},
		{
			name:      "disk options: native I/O without cache none",
			edit:      func(s *domainv1.DomainSpec) { s.Disks[0].Io = "native" },
			wantField: "disks[0].io",
		},
		{
			name: "disk options: an I/O thread on sata",
			edit: func(s *domainv1.DomainSpec) {
				s.Disks[0].Bus, s.Disks[0].DedicatedIothread = domainv1.DiskBus_DISK_BUS_SATA, true
			},
			wantField: "disks[0].iothread",
		},
		{
			name:      "disk options: a pool thread's name",
			edit:      func(s *domainv1.DomainSpec) { s.Disks[0].Iothread = "mythread" },
			wantField: "disks[0].iothread",
		},
		{
			name:      "disk options: block size",
			edit:      func(s *domainv1.DomainSpec) { s.Disks[0].LogicalBlockSize = 1000 },
			wantField: "disks[0].logicalBlockSize",
		},
		{
			name:      "disk options: error policy",
			edit:      func(s *domainv1.DomainSpec) { s.Disks[0].ErrorPolicy = "retry" },
			wantField: "disks[0].errorPolicy",
		},
		{
			name:      "disk options: queues on scsi",
			edit:      func(s *domainv1.DomainSpec) { s.Disks[0].Bus, s.Disks[0].Queues = domainv1.DiskBus_DISK_BUS_SCSI, 2 },
			wantField: "disks[0].queues",
		},
		{
			name: "NUMA cells, one bound to host nodes",
			edit: func(s *domainv1.DomainSpec) {
				s.Cpu = &domainv1.CPU{Sockets: 1, Cores: 3, Threads: 1, NumaCells: []*domainv1.NUMACell{
					{Vcpus: []uint32{0, 2}, MemoryBytes: 128 << 20, HostNodes: []uint32{0, 1}},
					{Vcpus: []uint32{1}, MemoryBytes: 128 << 20},
				}}
			},
			want: []string{`<numa><cell id="0" cpus="0,2" memory="131072" unit="KiB"></cell><cell id="1" cpus="1" memory="131072" unit="KiB"></cell></numa>`,
				`<numatune><memnode cellid="0" mode="strict" nodeset="0,1"></memnode></numatune>`},
		},
		{
			name: "the spec's uuid",
			edit: func(s *domainv1.DomainSpec) { s.Uuid = "11111111-2222-3333-4444-555555555555" },
			want: []string{`<uuid>11111111-2222-3333-4444-555555555555</uuid>`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := baseSpec()
			tc.edit(spec)
			env := tc.env
			if env.Emulator == "" {
				env = tcg
			}
			d, err := BuildDomain(spec, env)
			switch {
			case tc.wantField != "":
				var verr domain.ValidationError
				if !errors.As(err, &verr) {
					t.Fatalf("BuildDomain: %v, want a validation error naming %s", err, tc.wantField)
				}
				for _, f := range verr {
					if f.Field == tc.wantField {
						return
					}
				}
				t.Fatalf("BuildDomain: %v, want one naming %s", err, tc.wantField)
			case tc.wantPrecondition != "":
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.wantPrecondition) {
					t.Fatalf("BuildDomain: %v, want FailedPrecondition naming %s", err, tc.wantPrecondition)
				}
				return
			case err != nil:
				t.Fatalf("BuildDomain: %v", err)
			}
			x, err := d.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			flat := strings.NewReplacer("\n", "", "  ", "").Replace(x)
			for _, w := range tc.want {
				if !strings.Contains(flat, w) {
					t.Errorf("the domain XML lacks %s:\n%s", w, x)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(flat, w) {
					t.Errorf("the domain XML has %s:\n%s", w, x)
				}
			}
		})
	}
}

// TestBuildDomainRefuses: what the driver does not implement is refused naming the field.
func TestBuildDomainRefuses(t *testing.T) {
	for field, edit := range map[string]func(*domainv1.DomainSpec){
		"launchSecurity":   func(s *domainv1.DomainSpec) { s.LaunchSecurity = &domainv1.LaunchSecurity{} },
		"memory.hugepages": func(s *domainv1.DomainSpec) { s.Memory.Hugepages = &domainv1.Hugepages{} },
		`hostDevices[0]: "sim" (resource "example-sim" of device driver "sim", ids sim-0) has no PCI address`: func(s *domainv1.DomainSpec) {
			s.HostDevices = []*domainv1.HostDevice{{Name: "sim", Resource: "example-sim", DeviceDriver: "sim", DeviceIds: []string{"sim-0"}}}
		},
		"firmware.bios.useSerial": func(s *domainv1.DomainSpec) {
			s.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: true}}}
		},
	} {
		spec := baseSpec()
		edit(spec)
		_, err := BuildDomain(spec, Env{Accel: qmp.AccelTCG})
		var verr domain.ValidationError
		if !errors.As(err, &verr) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: BuildDomain: %v, want a validation error naming it", field, err)
		}
	}
}

func withOVMF(env Env) Env {
	env.OVMF = qmp.OVMF{Code: "/ovmf/CODE.fd", Vars: "/ovmf/VARS.fd"}
	env.NVRAM = "/run/vm/efi-vars.fd"
	return env
}

// TestDomainUUID: a VM without a uuid gets one of its id, the same on every Start, a valid
// RFC 4122 name-based UUID, and another VM another.
func TestDomainUUID(t *testing.T) {
	a, b := domainUUID(&domainv1.DomainSpec{Id: "a"}), domainUUID(&domainv1.DomainSpec{Id: "b"})
	if a != domainUUID(&domainv1.DomainSpec{Id: "a"}) || a == b {
		t.Errorf("domainUUID: %s and %s", a, b)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(a) {
		t.Errorf("domainUUID = %q, not a version 5 UUID", a)
	}
}

// TestCheckVarsTemplate: a persistent EFI store is recorded with its template's kind, and
// refused to a VM booting the other firmware build.
func TestCheckVarsTemplate(t *testing.T) {
	vars := filepath.Join(t.TempDir(), "vars.fd")
	if err := checkVarsTemplate(vars, varsTemplatePlain); err != nil {
		t.Fatal(err)
	}
	if err := checkVarsTemplate(vars, varsTemplatePlain); err != nil {
		t.Fatal(err)
	}
	if err := checkVarsTemplate(vars, varsTemplateSecure); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("checkVarsTemplate with the other kind: %v, want FailedPrecondition", err)
	}
}
