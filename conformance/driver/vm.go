package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Guest describes a bootable test guest and how it shows its progress on its serial console.
// GuestFromDir returns the project's test guest (hack/guest).
type Guest struct {
	// Kernel, Initrd and Cmdline boot the guest directly (firmware "kernel"). Absolute paths on
	// the node.
	Kernel, Initrd, Cmdline string
	// Disk is a bootable disk image (raw or qcow2) on the node: the base of a containerDisk
	// volume of every VM the checks boot, when the storage driver declares containerDisk. The
	// VM boots from it (firmware "bios") when Kernel is empty or the hypervisor does not
	// declare firmware "kernel"; otherwise it is a data disk.
	Disk string
	// ReadyMarker is printed on every boot once the guest is up and reads its console.
	// Required.
	ReadyMarker string
	// UserDataBegin and UserDataEnd are printed around the user-data the guest got from its
	// cloud-init seed, before ReadyMarker or soon after. Without them the CloudInit checks are
	// skipped.
	UserDataBegin, UserDataEnd string
	// PoweroffMarker is printed when the guest powers off on an ACPI power-button press.
	// Without it Shutdown/GracefulWithinTimeout does not look for it.
	PoweroffMarker string
	// RNGMarker starts the console line on which the guest lists its kernel's hardware RNGs
	// before ReadyMarker ("KUBEVISOR-RNG: virtio_rng.0"). Without it Devices/RNG is skipped.
	RNGMarker string
	// DMIMarker starts the console lines, one per SMBIOS string, on which the guest prints its
	// chassis information before ReadyMarker ("KUBEVISOR-DMI: chassis_vendor=Acme", with the
	// keys of Linux's /sys/class/dmi/id). Without it Devices/Chassis is skipped.
	DMIMarker string
	// PCIMarker starts the console line on which the guest lists its PCI devices as
	// vendor:device before ReadyMarker ("KUBEVISOR-PCI: 1af4:1045 8086:25ab"). Without it
	// Devices/Watchdog, Devices/Balloon, Devices/VirtioTransitional, Devices/Input and
	// Devices/Sound are skipped.
	PCIMarker string
	// InputMarker starts the console lines, one per input device its kernel registered, before
	// ReadyMarker ("KUBEVISOR-INPUT: QEMU Virtio Tablet"). Without it Devices/Input is skipped.
	InputMarker string
	// ClockMarker starts the console line on which the guest prints its real-time clock in
	// seconds since the epoch (read as UTC) and its kernel's clock sources before ReadyMarker
	// ("KUBEVISOR-CLOCK: rtc=1796220384 clocksources=tsc,hpet,acpi_pm"). Without it Clock/Start is
	// skipped.
	ClockMarker string
	// CPUFlagsMarker starts the console line on which the guest prints its CPU's flags, by the
	// kernel's names, before ReadyMarker ("KUBEVISOR-CPUFLAGS: fpu vme ... aes"). Without it
	// CPU/Features is skipped.
	CPUFlagsMarker string
	// AgentMarker starts the console line on which the guest says, before ReadyMarker, that its
	// guest agent runs on the agent's channel ("KUBEVISOR-AGENT: org.qemu.guest_agent.0
	// /dev/vport1p1"), or that it found none ("KUBEVISOR-AGENT: none"). Without it
	// GuestAgent/PingExec is skipped.
	AgentMarker string
	// TPMMarker starts the console line on which the guest names the first TPM its kernel
	// found, with its TPM major version as version=N, before ReadyMarker ("KUBEVISOR-TPM: tpm0
	// version=2 driver=tpm_crb"), or says none. Without it Devices/TPM is skipped. When the
	// line also has resets=N, the TPM's reset count (TPM2_ReadClock's clockInfo.resetCount,
	// which the TPM keeps in its state and counts up at every TPM reset, each boot),
	// TPM/Persistent checks by it that a persistent TPM's state is kept; it is skipped
	// otherwise.
	TPMMarker string
	// EFIVarMarker, when set, says that Disk boots with UEFI (without Secure Boot) as well,
	// and starts the console line on which the guest, booted so, counts the boots its EFI
	// variable store has seen, as boots=N before ReadyMarker ("KUBEVISOR-EFIVAR: boots=1"):
	// a variable it adds to the store at each boot. Without it Firmware/EFIPersistent is
	// skipped.
	EFIVarMarker string
	// MemoryBytes is the guest memory. Default: DefaultGuestMemory.
	MemoryBytes uint64
	// Machine is the machine type ("q35", "pc"); empty means the hypervisor's default.
	Machine string
	// BootTimeout bounds a boot, from Start (or Reboot) to ReadyMarker. Default:
	// DefaultBootTimeout.
	BootTimeout time.Duration
}

// GuestKernelTrouble matches, on a Linux guest's console, the first line of its kernel's
// reports of a fault in itself or in the memory it manages (an oops, a BUG, a bad page, a
// corrupted list, a panic): what a guest whose memory arrived damaged after a migration shows
// first, often while its heartbeat still goes on.
var GuestKernelTrouble = regexp.MustCompile(`Oops|BUG: |Bad page (state|map)|Kernel panic|general protection fault|Unable to handle kernel|list_(add|del) corruption`)

// The console markers of the project's test guest (hack/guest/README.md).
const (
	GuestReadyMarker    = "KUBEVISOR-GUEST-READY"
	GuestUserDataBegin  = "KUBEVISOR-USERDATA-BEGIN"
	GuestUserDataEnd    = "KUBEVISOR-USERDATA-END"
	GuestPoweroffMarker = "KUBEVISOR-POWEROFF"
	GuestRNGMarker      = "KUBEVISOR-RNG:"
	GuestDMIMarker      = "KUBEVISOR-DMI:"
	GuestPCIMarker      = "KUBEVISOR-PCI:"
	GuestInputMarker    = "KUBEVISOR-INPUT:"
	GuestClockMarker    = "KUBEVISOR-CLOCK:"
	GuestCPUFlagsMarker = "KUBEVISOR-CPUFLAGS:"
	GuestAgentMarker    = "KUBEVISOR-AGENT:"
	GuestTPMMarker      = "KUBEVISOR-TPM:"
	GuestEFIVarMarker   = "KUBEVISOR-EFIVAR:"
	// GuestBuildInfoFile is the project's guest's build record; an "efi-loader=" line in it
	// says that its disk boots with UEFI too.
	GuestBuildInfoFile = "BUILD-INFO"
)

// The files of the project's test guest in the directory `make guest` builds it into.
const (
	GuestKernelFile  = "vmlinuz"
	GuestInitrdFile  = "initramfs.cpio.gz"
	GuestCmdlineFile = "cmdline"
	GuestDiskFile    = "disk.qcow2"
)

// Defaults of the VM checks.
const (
	// DefaultGuestMemory is the memory of a Guest that does not say.
	DefaultGuestMemory = 256 << 20
	// DefaultBootTimeout is the BootTimeout of a Guest that does not say.
	DefaultBootTimeout = 2 * time.Minute
	// DefaultVMTimeout bounds each VM check unless WithTimeout says otherwise: a boot, a
	// shutdown and what the check does in between.
	DefaultVMTimeout = 5 * time.Minute
	// DefaultGuestShutdownTimeout is the timeout the VM checks give Shutdown unless
	// WithShutdownTimeout says otherwise: long enough for a guest to power off by itself.
	DefaultGuestShutdownTimeout = time.Minute
)

// Timings of the VM checks.
const (
	// killWithin is how soon Kill of a running VM must return.
	killWithin = 15 * time.Second
	// goneWithin is how soon after Kill returns the VM process must be gone.
	goneWithin = 5 * time.Second
	// userDataWithin is how long after its ready marker a guest may still print its user-data.
	userDataWithin = 10 * time.Second
	// commandWithin bounds waiting for the output of a command typed on the console.
	commandWithin = 30 * time.Second
	// pauseSettle is how long output already on its way may still arrive after Pause.
	pauseSettle = 500 * time.Millisecond
	// pauseQuiet is how long a paused guest must print nothing.
	pauseQuiet = 2 * time.Second
	// tickCommand prints tickText five times a second, for ever, in a POSIX shell whose sleep
	// takes fractions (busybox, coreutils); tickText does not occur in the command, which the
	// terminal echoes.
	tickCommand = "while :; do echo kv-tick-$((6*7)); sleep 0.2; done"
	tickText    = "kv-tick-42"
	// ticksBefore is how many ticks the Pause check waits for before pausing.
	ticksBefore = 3
)

// GuestFromDir returns the project's test guest as `make guest` builds it into dir
// (_output/guest): direct kernel boot when dir holds a kernel and an initramfs, its disk image
// when it holds one, and its console markers. It fails, with an error that wraps
// fs.ErrNotExist, when dir holds neither a kernel with its initramfs nor a disk image.
func GuestFromDir(dir string) (Guest, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Guest{}, fmt.Errorf("guest directory: %w", err)
	}
	exists := func(name string) bool {
		fi, err := os.Stat(filepath.Join(abs, name))
		return err == nil && fi.Mode().IsRegular()
	}
	g := Guest{
		ReadyMarker:    GuestReadyMarker,
		UserDataBegin:  GuestUserDataBegin,
		UserDataEnd:    GuestUserDataEnd,
		PoweroffMarker: GuestPoweroffMarker,
		RNGMarker:      GuestRNGMarker,
		DMIMarker:      GuestDMIMarker,
		PCIMarker:      GuestPCIMarker,
		InputMarker:    GuestInputMarker,
		ClockMarker:    GuestClockMarker,
		CPUFlagsMarker: GuestCPUFlagsMarker,
		AgentMarker:    GuestAgentMarker,
		TPMMarker:      GuestTPMMarker,
	}
	if exists(GuestKernelFile) && exists(GuestInitrdFile) {
		g.Kernel, g.Initrd = filepath.Join(abs, GuestKernelFile), filepath.Join(abs, GuestInitrdFile)
		g.Cmdline = "console=ttyS0"
		if b, err := os.ReadFile(filepath.Join(abs, GuestCmdlineFile)); err == nil && strings.TrimSpace(string(b)) != "" {
			g.Cmdline = strings.TrimSpace(string(b))
		}
	}
	if exists(GuestDiskFile) {
		g.Disk = filepath.Join(abs, GuestDiskFile)
		if b, err := os.ReadFile(filepath.Join(abs, GuestBuildInfoFile)); err == nil && strings.Contains(string(b), "\nefi-loader=") {
			g.EFIVarMarker = GuestEFIVarMarker
		}
	}
	if g.Kernel == "" && g.Disk == "" {
		return Guest{}, fmt.Errorf("guest directory %s holds neither %s with %s nor %s (build it with make guest): %w",
			abs, GuestKernelFile, GuestInitrdFile, GuestDiskFile, fs.ErrNotExist)
	}
	return g, nil
}

// validate reports what makes g unusable.
func (g Guest) validate() error {
	var errs []error
	switch {
	case g.ReadyMarker == "":
		errs = append(errs, errors.New("ReadyMarker is required"))
	case g.Kernel == "" && g.Disk == "":
		errs = append(errs, errors.New("one of Kernel and Disk is required"))
	case g.Kernel == "" && (g.Initrd != "" || g.Cmdline != ""):
		errs = append(errs, errors.New("a Kernel is required with Initrd and Cmdline"))
	}
	for _, p := range []struct{ field, path string }{{"Kernel", g.Kernel}, {"Initrd", g.Initrd}, {"Disk", g.Disk}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("%s must be an absolute path, not %q", p.field, p.path))
		}
	}
	if (g.UserDataBegin == "") != (g.UserDataEnd == "") {
		errs = append(errs, errors.New("UserDataBegin and UserDataEnd go together"))
	}
	return errors.Join(errs...)
}

func (g Guest) withDefaults() Guest {
	if g.MemoryBytes == 0 {
		g.MemoryBytes = DefaultGuestMemory
	}
	if g.BootTimeout <= 0 {
		g.BootTimeout = DefaultBootTimeout
	}
	return g
}

// VM runs a hypervisor and a storage driver together with a real guest, as subtests of t:
//
//	Boot/ConsoleMarker
//	CloudInit/UserDataReachesGuest      (volume type cloudInitNoCloud; Guest.UserDataBegin/End)
//	CloudInit/ConfigDrive               (volume type cloudInitConfigDrive; Guest.UserDataBegin/End)
//	Shutdown/GracefulWithinTimeout
//	Kill
//	Pause/StopsGuest                    (FEATURE_HYPERVISOR_PAUSE)
//	Reboot/SecondBoot                   (FEATURE_HYPERVISOR_REBOOT)
//	SoftReboot/BootsAgain               (FEATURE_HYPERVISOR_SOFT_REBOOT)
//	GuestAgent/PingExec                 (FEATURE_HYPERVISOR_GUEST_EXEC; Guest.AgentMarker)
//	Display/RFBSessions                 (FEATURE_HYPERVISOR_DISPLAY)
//	Recover/AfterDriverKilled           (FEATURE_HYPERVISOR_RECOVER, and WithDriverKill)
//	Devices/RNG                         (device "rng"; Guest.RNGMarker)
//	Devices/Chassis                     (device "chassis"; Guest.DMIMarker)
//	Devices/Watchdog                    (device "watchdog"; Guest.PCIMarker)
//	Devices/Balloon                     (device "balloon"; Guest.PCIMarker)
//	Devices/Input                       (device "input"; Guest.PCIMarker and InputMarker)
//	Devices/Sound                       (device "sound"; Guest.PCIMarker)
//	Devices/VirtioTransitional          (devices "balloon" and "virtio-transitional"; Guest.PCIMarker)
//	Devices/TPM                         (device "tpm"; Guest.TPMMarker)
//	TPM/Persistent                      (device "tpm", Capabilities.persistent_state; Guest.TPMMarker with resets=N)
//	Firmware/EFIPersistent              (firmware "efi", Capabilities.persistent_state, volume type containerDisk; Guest.Disk and EFIVarMarker)
//	Clock/Start                         (device "clock"; Guest.ClockMarker)
//	CPU/Features                        (device "cpu-features"; Guest.CPUFlagsMarker)
//	CPU/Pinning                         (device "cpu-pinning"; the kit on two CPUs or more)
//	Storage/NotAnImage                  (volume type containerDisk)
//	Migrate/KeepsGuestState             (FEATURE_HYPERVISOR_MIGRATE, and WithMigrationPeer)
//	Migrate/Progress                    (FEATURE_HYPERVISOR_MIGRATE, and WithMigrationPeer)
//	Migrate/Cancel                      (FEATURE_HYPERVISOR_MIGRATE, and WithMigrationPeer)
//	Migrate/LocalDisks                  (FEATURE_HYPERVISOR_MIGRATE, Capabilities.migration_disks, volume type emptyDisk, and WithMigrationPeer)
//	Migrate/LocalDisksCancel            (FEATURE_HYPERVISOR_MIGRATE, Capabilities.migration_disks, volume type emptyDisk, and WithMigrationPeer)
//
// Every check but Storage/NotAnImage boots a VM of its own and needs the hypervisor to declare
// FEATURE_HYPERVISOR_CONSOLE, on which it watches the guest. The storage driver prepares the
// VM's volumes (a containerDisk over Guest.Disk, an emptyDisk, a cloud-init seed with a random
// token in its user-data: those of them it declares), and the kit builds the domain spec from
// the prepared disks: the guest's kernel, or the BIOS booting the containerDisk; disks on
// Options.DiskBus (virtio) and CD-ROMs on Options.CDROMBus (scsi), which the hypervisor must
// declare in Capabilities.disk_buses; the serial console on a socket in the VM's run directory.
// The guest's shell must read the console after Guest.ReadyMarker: Pause/StopsGuest and
// Recover/AfterDriverKilled type commands there.
//
// Every VM runs as under the node handler: a kubevisor-launcher of its own holds its sandbox
// (WithLauncher names the binary; by default FindLauncher's, else one built with the go command),
// and the domain spec names the launcher's socket and network namespace. The hypervisor must
// declare Capabilities.launcher, and a VM process it reports (Status.pid) must be the launcher's
// process: started through core/driver/launcher, not by the driver itself. With
// WithLauncherCapabilities each launcher runs as in a launcher pod of a HypervisorClass: root
// with that class's capabilities only.
//
// Options.Config, StateDir and NodeName configure the hypervisor, WithStorageConfig and
// WithStorageStateDir the storage driver. Each check takes up to Options.Timeout
// (DefaultVMTimeout unless WithTimeout) and gives Shutdown Options.ShutdownTimeout
// (DefaultGuestShutdownTimeout unless WithShutdownTimeout). A VM is killed and deleted, and its
// volumes are released, when its check ends. The kit must run on the drivers' node: it reads
// the prepared disks and looks for the VM process by the pid Status reports.
func VM(t T, hv HypervisorFactory, st StorageFactory, g Guest, opts ...Option) {
	t.Helper()
	var given Options
	for _, o := range opts {
		o(&given)
	}
	var defaults []Option
	if given.Timeout <= 0 {
		defaults = append(defaults, WithTimeout(DefaultVMTimeout))
	}
	if given.ShutdownTimeout <= 0 {
		defaults = append(defaults, WithShutdownTimeout(DefaultGuestShutdownTimeout))
	}
	s := &vmSuite{
		suite:    newSuite(t, basev1.Kind_KIND_HYPERVISOR, func(t T) driver.Driver { return nilIfNil(hv(t)) }, append(defaults, opts...)),
		newST:    st,
		guest:    g.withDefaults(),
		buildDir: t.TempDir(),
	}
	if s.opts.StorageStateDir == "" {
		s.opts.StorageStateDir = t.TempDir()
	}
	if s.opts.MigrationPeerStateDir == "" {
		s.opts.MigrationPeerStateDir = t.TempDir()
	}
	if s.opts.DiskBus == domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
		s.opts.DiskBus = domainv1.DiskBus_DISK_BUS_VIRTIO
	}
	if s.opts.CDROMBus == domainv1.DiskBus_DISK_BUS_UNSPECIFIED {
		s.opts.CDROMBus = domainv1.DiskBus_DISK_BUS_SCSI
	}
	if err := g.validate(); err != nil {
		t.Fatalf("the guest cannot be used: %v", err)
	}
	t.Run("Boot", func(t T) {
		t.Run("ConsoleMarker", s.checkBootConsoleMarker)
	})
	t.Run("CloudInit", func(t T) {
		t.Run("UserDataReachesGuest", s.checkCloudInitNoCloud)
		t.Run("ConfigDrive", s.checkCloudInitConfigDrive)
	})
	t.Run("Shutdown", func(t T) {
		t.Run("GracefulWithinTimeout", s.checkShutdownGraceful)
	})
	t.Run("Kill", s.checkKill)
	t.Run("Pause", func(t T) {
		t.Run("StopsGuest", s.checkPauseStopsGuest)
	})
	t.Run("Reboot", func(t T) {
		t.Run("SecondBoot", s.checkRebootSecondBoot)
	})
	t.Run("SoftReboot", func(t T) {
		t.Run("BootsAgain", s.checkSoftRebootBootsAgain)
	})
	t.Run("GuestAgent", func(t T) {
		t.Run("PingExec", s.checkGuestAgentPingExec)
	})
	t.Run("Display", func(t T) {
		t.Run("RFBSessions", s.checkDisplayRFBSessions)
	})
	t.Run("Recover", func(t T) {
		t.Run("AfterDriverKilled", s.checkRecoverAfterDriverKilled)
	})
	t.Run("Devices", func(t T) {
		t.Run("RNG", s.checkDevicesRNG)
		t.Run("Chassis", s.checkDevicesChassis)
		t.Run("Watchdog", s.checkDevicesWatchdog)
		t.Run("Balloon", s.checkDevicesBalloon)
		t.Run("Input", s.checkDevicesInput)
		t.Run("Sound", s.checkDevicesSound)
		t.Run("VirtioTransitional", s.checkDevicesVirtioTransitional)
		t.Run("TPM", s.checkDevicesTPM)
	})
	t.Run("TPM", func(t T) {
		t.Run("Persistent", s.checkTPMPersistent)
	})
	t.Run("Firmware", func(t T) {
		t.Run("EFIPersistent", s.checkFirmwareEFIPersistent)
	})
	t.Run("Clock", func(t T) {
		t.Run("Start", s.checkClockStart)
	})
	t.Run("CPU", func(t T) {
		t.Run("Features", s.checkCPUFeatures)
		t.Run("Pinning", s.checkCPUPinning)
	})
	t.Run("Storage", func(t T) {
		t.Run("NotAnImage", s.checkStorageNotAnImage)
	})
	t.Run("Migrate", func(t T) {
		t.Run("KeepsGuestState", s.checkMigrateKeepsGuestState)
		t.Run("Progress", s.checkMigrateProgress)
		t.Run("Cancel", s.checkMigrateCancel)
		t.Run("LocalDisks", s.checkMigrateLocalDisks)
		t.Run("LocalDisksCancel", s.checkMigrateLocalDisksCancel)
	})
}

// vmSuite is one run of the VM checks. Its suite is the hypervisor's.
type vmSuite struct {
	*suite
	newST StorageFactory
	guest Guest

	// launcher is the launcher binary, found (or built into buildDir) on first use.
	launcherOnce sync.Once
	buildDir     string
	launcher     string
	launcherErr  error
	// confine, when set, confines every launcher (WithLauncherCapabilities).
	confine *confinement
}

// launcherBinary finds the launcher binary, and what confines it, once.
func (s *vmSuite) launcherBinary() {
	s.launcherOnce.Do(func() {
		s.launcher, s.launcherErr = findLauncher(s.opts.Launcher, s.buildDir, true)
		if s.launcherErr == nil && s.opts.ConfineLauncher {
			s.confine, s.launcherErr = newConfinement(s.opts.LauncherCapabilities)
		}
	})
}

// Names of the volumes of a VM the checks boot.
const (
	containerDiskVolume = "containerdisk"
	emptyDiskVolume     = "emptydisk"
	cloudInitVolume     = "cloudinitdisk"
)

// hypervisor returns the configured hypervisor and its capabilities.
func (s *vmSuite) hypervisor(t T) (driver.Hypervisor, *basev1.Capabilities) {
	t.Helper()
	d := s.driver(t).(driver.Hypervisor)
	return d, s.capabilities(t, d)
}

// storage returns the configured storage driver and its capabilities.
func (s *vmSuite) storage(t T) (driver.Storage, *basev1.Capabilities) {
	t.Helper()
	d := s.newST(t)
	if d == nil {
		t.Fatalf("the storage factory returned no driver")
	}
	req := &basev1.ConfigureRequest{
		Config:          s.opts.StorageConfig,
		NodeName:        s.opts.NodeName,
		StateDir:        s.opts.StorageStateDir,
		ProtocolVersion: driver.ProtocolVersion,
	}
	if err := d.Configure(s.ctx(t), req); err != nil {
		t.Fatalf("Configure of the storage driver: %s", describe(err))
	}
	caps, err := d.Capabilities(s.ctx(t))
	if err != nil {
		t.Fatalf("Capabilities of the storage driver: %s", describe(err))
	}
	if caps == nil {
		caps = &basev1.Capabilities{}
	}
	return d, caps
}

// guestVM is a VM a check booted.
type guestVM struct {
	id     string
	handle *hypervisorv1.Handle
	// token is in the VM's user-data.
	token string
	// d is the driver that manages the VM: a new one after Recover.
	d       driver.Hypervisor
	console *consoleSession
	// launcher holds the VM's sandbox.
	launcher *sandboxLauncher
	// spec is the VM's domain spec as created.
	spec *domainv1.DomainSpec
}

// bootPlan is how a check boots its VM.
type bootPlan struct {
	kernel  bool
	volumes []*storagev1.Volume
}

// plan works out the firmware and the volumes of a VM from what the drivers declare, skipping
// the check when they cannot boot the guest. seed is the cloud-init volume type the check
// needs, or "" for cloudInitNoCloud when the storage driver declares it.
func (s *vmSuite) plan(t T, hvCaps, stCaps *basev1.Capabilities, seed, token string) bootPlan {
	t.Helper()
	g := s.guest
	hasFirmware := func(f string) bool { return slices.Contains(hvCaps.GetFirmware(), f) }
	hasVolume := func(v string) bool { return slices.Contains(stCaps.GetVolumeTypes(), v) }
	var p bootPlan
	switch {
	case g.Kernel != "" && hasFirmware("kernel"):
		p.kernel = true
	case g.Disk != "" && hasFirmware("bios"):
		if !hasVolume("containerDisk") {
			t.Skipf("storage driver does not declare volume type containerDisk, which the guest's disk boots from (the hypervisor does not declare firmware kernel, or the guest has no Kernel)")
		}
	case g.Kernel != "" && g.Disk != "":
		t.Skipf("hypervisor declares neither firmware kernel nor bios, which the guest boots with")
	case g.Kernel != "":
		t.Skipf("hypervisor does not declare firmware kernel, which the guest boots with (it has no Disk)")
	default:
		t.Skipf("hypervisor does not declare firmware bios, which the guest's disk boots with (it has no Kernel)")
	}
	if g.Disk != "" && hasVolume("containerDisk") {
		p.volumes = append(p.volumes, &storagev1.Volume{Name: containerDiskVolume, Source: &storagev1.Volume_ContainerDisk{
			ContainerDisk: &storagev1.ContainerDisk{Image: "kubevisor.io/conformance-guest:latest", Path: g.Disk},
		}})
	}
	if hasVolume("emptyDisk") {
		p.volumes = append(p.volumes, emptyDisk(emptyDiskVolume))
	}
	if seed == "" && hasVolume("cloudInitNoCloud") {
		seed = "cloudInitNoCloud"
	}
	if seed != "" {
		if !hasVolume(seed) {
			t.Skipf("storage driver does not declare volume type %s", seed)
		}
		p.volumes = append(p.volumes, seedVolume(seed, token))
	}
	return p
}

// seedVolume is a cloud-init volume of type typ whose user-data holds token.
func seedVolume(typ, token string) *storagev1.Volume {
	ci := &storagev1.CloudInit{
		UserData: fmt.Appendf(nil, "#cloud-config\n# kubevisor conformance\nkubevisor_conformance_token: %s\n", token),
		Hostname: "conformance",
	}
	v := &storagev1.Volume{Name: cloudInitVolume}
	if typ == "cloudInitConfigDrive" {
		v.Source = &storagev1.Volume_CloudInitConfigDrive{CloudInitConfigDrive: ci}
	} else {
		v.Source = &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: ci}
	}
	return v
}

// busName is the name of a disk bus in Capabilities.disk_buses.
func busName(b domainv1.DiskBus) string {
	return strings.ToLower(strings.TrimPrefix(b.String(), "DISK_BUS_"))
}

// domainPlan is what guestDomain builds a domain spec from, besides the prepared disks.
type domainPlan struct {
	ID, RunDir string
	Guest      Guest
	// KernelBoot boots Guest.Kernel; otherwise the BIOS boots the disk of BootVolume.
	KernelBoot bool
	BootVolume string
	DiskBus    domainv1.DiskBus
	CDROMBus   domainv1.DiskBus
}

// serialSocket is the name of the serial console's socket in a VM's run directory.
const serialSocket = "serial.sock"

// guestDomain is the domain spec of a VM the checks boot: the guest's firmware, memory and
// machine type; its serial console on a socket in the run directory; and one disk per prepared
// disk, in order, named after its volume: a CD-ROM on p.CDROMBus for media the storage driver
// marked cdrom, a disk on p.DiskBus otherwise, with the boot volume first in the boot order.
func guestDomain(p domainPlan, disks []*storagev1.PreparedDisk) *domainv1.DomainSpec {
	g := p.Guest
	spec := &domainv1.DomainSpec{
		Id:       p.ID,
		Name:     "conformance/" + p.ID,
		Uuid:     p.ID,
		Memory:   &domainv1.Memory{GuestBytes: g.MemoryBytes},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}},
		Serial:   &domainv1.Serial{SocketPath: filepath.Join(p.RunDir, serialSocket)},
		RunDir:   p.RunDir,
		Labels:   map[string]string{"kubevisor.io/conformance": "true"},
	}
	if g.MemoryBytes == 0 {
		spec.Memory.GuestBytes = DefaultGuestMemory
	}
	if g.Machine != "" {
		spec.Machine = &domainv1.Machine{Type: g.Machine}
	}
	if p.KernelBoot {
		spec.Firmware.Boot = &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
			KernelPath: g.Kernel, InitrdPath: g.Initrd, Cmdline: g.Cmdline,
		}}
	}
	for _, d := range disks {
		disk := &domainv1.Disk{
			Name:     d.GetVolumeName(),
			Path:     d.GetPath(),
			Format:   d.GetFormat(),
			Bus:      p.DiskBus,
			ReadOnly: d.GetReadOnly(),
		}
		if d.GetCdrom() {
			disk.Device = domainv1.DiskDevice_DISK_DEVICE_CDROM
			disk.Bus = p.CDROMBus
			disk.ReadOnly = true
		}
		if !p.KernelBoot && d.GetVolumeName() == p.BootVolume {
			disk.BootOrder = 1
		}
		spec.Disks = append(spec.Disks, disk)
	}
	return spec
}

// shortTempDir makes a directory for a VM's sockets, removed when the check ends. A unix
// socket path has at most 107 bytes, which a test's TempDir can exceed: it is made in
// os.TempDir() when that is short, else in /tmp.
func shortTempDir(t T) string {
	t.Helper()
	base := os.TempDir()
	if len(base) > 40 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "kvc-vm-")
	if err != nil {
		t.Fatalf("make a run directory: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return dir
}

// boot prepares the volumes of a VM, creates and starts it, follows its console, and waits
// for Guest.ReadyMarker; seed is as for plan. The VM is killed and deleted, and its volumes
// released, when the check ends.
func (s *vmSuite) boot(t T, seed string) *guestVM {
	t.Helper()
	return s.bootWith(t, seed, nil)
}

// bootWith is boot with edit applied to the domain spec before Create.
func (s *vmSuite) bootWith(t T, seed string, edit func(*domainv1.DomainSpec)) *guestVM {
	t.Helper()
	hv, hvCaps := s.hypervisor(t)
	requireFeature(t, hvCaps, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	c := optional[driver.Consoler](t, hv, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	st, stCaps := s.storage(t)
	vm := &guestVM{id: newID(), token: "kvc-" + strings.ReplaceAll(newID(), "-", ""), d: hv}
	plan := s.plan(t, hvCaps, stCaps, seed, vm.token)

	r := &request{vmiID: vm.id, workDir: t.TempDir(), volumes: plan.volumes}
	disks := (&storageSuite{s.suite}).prepare(t, st, r)
	for _, d := range disks {
		bus, what := s.opts.DiskBus, "disk"
		if d.GetCdrom() {
			bus, what = s.opts.CDROMBus, "CD-ROM"
		}
		if !slices.Contains(hvCaps.GetDiskBuses(), busName(bus)) {
			t.Skipf("hypervisor does not declare disk bus %s, on which the kit attaches the %s of volume %q (WithDiskBus, WithCDROMBus choose another)", busName(bus), what, d.GetVolumeName())
		}
	}

	// Every VM runs under a launcher, as under the node handler, which sets
	// sandbox.launcher_socket for every VM.
	if !hvCaps.GetLauncher() {
		t.Fatalf("the hypervisor does not declare Capabilities.launcher: the node handler sets sandbox.launcher_socket for every VM, and runs none on a driver that cannot start it through the launcher (core/driver/launcher)")
	}
	s.launcherBinary()
	vm.launcher = s.startLauncher(t, vm.id)

	runDir := shortTempDir(t)
	spec := guestDomain(domainPlan{
		ID: vm.id, RunDir: runDir, Guest: s.guest,
		KernelBoot: plan.kernel, BootVolume: containerDiskVolume,
		DiskBus: s.opts.DiskBus, CDROMBus: s.opts.CDROMBus,
	}, disks)
	spec.Sandbox = vm.launcher.sandbox
	if edit != nil {
		edit(spec)
	}
	vm.spec = spec
	handle, err := hv.Create(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("Create of a VM with the guest: %s", describe(err))
	}
	vm.handle = handle
	if handle == nil {
		vm.handle = &hypervisorv1.Handle{Id: vm.id}
	}
	t.Cleanup(func() { (&hvSuite{suite: s.suite}).remove(t, &testVM{id: vm.id, d: vm.d}) })
	if err := hv.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	vm.console = attachConsole(t, c, vm.id)
	if err := vm.console.out.WaitFor(s.ctx(t), s.guest.ReadyMarker, 1, s.guest.BootTimeout); err != nil {
		t.Fatalf("booting the guest (%s): %v; the launcher's log: %s", s.describeBoot(plan), err, vm.launcher.logTail())
	}
	s.checkUnderLauncher(t, vm)
	return vm
}

// describeBoot says how a VM boots, for a message.
func (s *vmSuite) describeBoot(p bootPlan) string {
	names := make([]string, len(p.volumes))
	for i, v := range p.volumes {
		names[i] = v.GetName()
	}
	how := "kernel " + s.guest.Kernel
	if !p.kernel {
		how = "BIOS from the containerDisk over " + s.guest.Disk
	}
	return fmt.Sprintf("%s; volumes %s", how, strings.Join(names, ", "))
}

// status returns a VM's status from the driver that manages it.
func (s *vmSuite) status(t T, vm *guestVM) *hypervisorv1.VMStatus {
	t.Helper()
	st, err := vm.d.Status(s.ctx(t), vm.id)
	if err != nil {
		t.Fatalf("Status: %s", describe(err))
	}
	return st
}

// expectState fails the check unless the VM is in state want; it returns the status.
func (s *vmSuite) expectState(t T, vm *guestVM, want hypervisorv1.State, after string) *hypervisorv1.VMStatus {
	t.Helper()
	st := s.status(t, vm)
	if st.GetState() != want {
		t.Errorf("after %s the VM is %s (reason %q, message %q), want %s", after, st.GetState(), st.GetReason(), st.GetMessage(), want)
	}
	return st
}

// sleep waits d or until the check's context is done.
func (s *vmSuite) sleep(t T, d time.Duration) {
	select {
	case <-time.After(d):
	case <-s.ctx(t).Done():
	}
}

// checkBootConsoleMarker: a VM made of the prepared volumes boots the guest to its ready
// marker and is running.
func (s *vmSuite) checkBootConsoleMarker(t T) {
	vm := s.boot(t, "")
	st := s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "the guest booted")
	if st.GetBoots() < 1 {
		t.Errorf("a booted VM reports %d boots, want at least 1", st.GetBoots())
	}
}

// requireUserDataMarkers skips a check without the guest's user-data markers.
func (s *vmSuite) requireUserDataMarkers(t T) {
	t.Helper()
	if s.guest.UserDataBegin == "" {
		t.Skipf("the guest has no user-data markers (Guest.UserDataBegin, Guest.UserDataEnd)")
	}
}

// checkCloudInitNoCloud: the user-data of a NoCloud seed reaches the guest.
func (s *vmSuite) checkCloudInitNoCloud(t T) {
	s.requireUserDataMarkers(t)
	s.checkUserData(t, "cloudInitNoCloud")
}

// checkCloudInitConfigDrive: the user-data of a ConfigDrive seed reaches the guest.
func (s *vmSuite) checkCloudInitConfigDrive(t T) {
	s.requireUserDataMarkers(t)
	s.checkUserData(t, "cloudInitConfigDrive")
}

func (s *vmSuite) checkUserData(t T, seed string) {
	vm := s.boot(t, seed)
	out := vm.console.out
	if err := out.WaitFor(s.ctx(t), s.guest.UserDataEnd, 1, userDataWithin); err != nil {
		t.Fatalf("the guest did not print the user-data of its %s seed (did it find the seed?): %v", seed, err)
	}
	userData, ok := between(out.String(), s.guest.UserDataBegin, s.guest.UserDataEnd)
	switch {
	case !ok:
		t.Errorf("the guest printed no user-data between %q and %q; %s", s.guest.UserDataBegin, s.guest.UserDataEnd, out.Tail())
	case !strings.Contains(userData, vm.token):
		t.Errorf("the user-data the guest printed does not hold the token %q of the %s volume: %q", vm.token, seed, userData)
	}
}

// between returns the text between the first begin and the end that follows it.
func between(s, begin, end string) (string, bool) {
	_, after, ok := strings.Cut(s, begin)
	if !ok {
		return "", false
	}
	in, _, ok := strings.Cut(after, end)
	return in, ok
}

// checkShutdownGraceful: Shutdown of a booted guest powers it off by itself within the
// timeout: graceful, the guest's power-off marker on the console, the VM stopped.
func (s *vmSuite) checkShutdownGraceful(t T) {
	vm := s.boot(t, "")
	start := time.Now()
	graceful, err := vm.d.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Shutdown: %s", describe(err))
	}
	if !graceful {
		t.Errorf("Shutdown with a timeout of %s returned graceful=false after %s: the guest, up and handling ACPI, must power off by itself", s.opts.ShutdownTimeout, took.Round(time.Millisecond))
	}
	if m := s.guest.PoweroffMarker; m != "" {
		if err := vm.console.out.WaitFor(s.ctx(t), m, 1, 10*time.Second); err != nil {
			t.Errorf("the guest did not show that it powered off: %v", err)
		}
	} else {
		t.Logf("the guest has no power-off marker (Guest.PoweroffMarker): not looked for")
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_STOPPED, "Shutdown returned")
	t.Logf("Shutdown took %s", took.Round(time.Millisecond))
}

// checkKill: Kill stops a running VM at once, and its process is gone.
func (s *vmSuite) checkKill(t T) {
	vm := s.boot(t, "")
	pid := s.status(t, vm).GetPid()
	start := time.Now()
	if err := vm.d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill of a running VM: %s", describe(err))
	}
	if took := time.Since(start); took > killWithin {
		t.Errorf("Kill of a running VM took %s, more than %s: it must stop the VM at once", took.Round(time.Millisecond), killWithin)
	}
	st := s.expectState(t, vm, hypervisorv1.State_STATE_STOPPED, "Kill returned")
	if st.GetPid() != 0 {
		t.Errorf("a killed VM reports pid %d, want none", st.GetPid())
	}
	switch {
	case pid == 0:
		t.Logf("note: the running VM reported no pid: whether its process is gone is not checked")
	case !processChecks:
		t.Logf("note: this platform cannot look for process %d", pid)
	default:
		ctx, cancel := context.WithTimeout(s.ctx(t), goneWithin)
		defer cancel()
		if !poll(ctx, func() bool { return !processRunning(int(pid)) }) {
			t.Errorf("the VM process (pid %d) is still running %s after Kill returned", pid, goneWithin)
		}
	}
}

// checkPauseStopsGuest: a paused guest prints nothing, and goes on printing once resumed.
func (s *vmSuite) checkPauseStopsGuest(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	vm := s.boot(t, "")
	p := optional[driver.Pauser](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	out := vm.console.out
	ctx := s.ctx(t)
	if err := vm.console.typeUntil(ctx, tickCommand, tickText, commandWithin); err != nil {
		t.Fatalf("make the guest print a line five times a second: %v", err)
	}
	if err := out.WaitFor(ctx, tickText, out.Count(tickText)+ticksBefore, commandWithin); err != nil {
		t.Fatalf("the guest does not go on printing: %v", err)
	}
	boots := s.status(t, vm).GetBoots()

	if err := p.Pause(ctx, vm.id); err != nil {
		t.Fatalf("Pause: %s", describe(err))
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_PAUSED, "Pause")
	s.sleep(t, pauseSettle)
	mark := out.Len()
	s.sleep(t, pauseQuiet)
	if n := out.Len(); n != mark {
		t.Errorf("the paused guest printed %d bytes in %s: %q", n-mark, pauseQuiet, out.String()[mark:])
	}

	ticks := out.Count(tickText)
	if err := p.Resume(ctx, vm.id); err != nil {
		t.Fatalf("Resume: %s", describe(err))
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "Resume")
	if err := out.WaitFor(ctx, tickText, ticks+2, commandWithin); err != nil {
		t.Errorf("the resumed guest did not go on printing: %v", err)
	}
	if got := s.status(t, vm).GetBoots(); got != boots {
		t.Errorf("Pause and Resume changed boots from %d to %d", boots, got)
	}
}

// checkRebootSecondBoot: Reboot boots the guest again, which the boot count shows.
func (s *vmSuite) checkRebootSecondBoot(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	vm := s.boot(t, "")
	r := optional[driver.Rebooter](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	boots := s.status(t, vm).GetBoots()
	ready := vm.console.out.Count(s.guest.ReadyMarker)
	if err := r.Reboot(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Reboot: %s", describe(err))
	}
	if err := vm.console.out.WaitFor(s.ctx(t), s.guest.ReadyMarker, ready+1, s.guest.BootTimeout); err != nil {
		t.Fatalf("the guest did not boot again after Reboot: %v", err)
	}
	st := s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "the second boot")
	if st.GetBoots() <= boots {
		t.Errorf("after Reboot the VM reports %d boots, want more than %d", st.GetBoots(), boots)
	}
}

// checkRecoverAfterDriverKilled: a VM outlives the crash of its driver process; the new
// process re-adopts it, the same VM process, whose console still works and which it can shut
// down.
func (s *vmSuite) checkRecoverAfterDriverKilled(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	if s.opts.DriverKill == nil {
		t.Skipf("no driver kill hook given (WithDriverKill): the check needs to kill the driver process")
	}
	vm := s.boot(t, "")
	pid := s.status(t, vm).GetPid()

	d2 := s.opts.DriverKill(t)
	if d2 == nil {
		t.Fatalf("the driver kill hook returned no driver")
	}
	s.configure(t, d2)
	vm.d = d2
	r := optional[driver.Recoverer](t, d2, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	st, err := r.Recover(s.ctx(t), vm.handle)
	if err != nil {
		t.Fatalf("Recover, after the driver process was killed, of a VM that was running: %s", describe(err))
	}
	if st.GetId() != vm.id || st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("Recover reports VM %q %s (reason %q, message %q), want %q RUNNING: the VM must outlive its driver", st.GetId(), st.GetState(), st.GetReason(), st.GetMessage(), vm.id)
	}
	st = s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "Recover")
	if pid != 0 && st.GetPid() != pid {
		t.Errorf("after Recover the VM reports pid %d, want %d: the VM process must be the same", st.GetPid(), pid)
	}
	s.checkUnderLauncher(t, vm)

	c := optional[driver.Consoler](t, d2, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	cs := attachConsole(t, c, vm.id)
	if err := cs.typeUntil(s.ctx(t), "echo kv-recovered-$((6*7))", "kv-recovered-42", commandWithin); err != nil {
		t.Fatalf("the console of the recovered VM: %v", err)
	}
	graceful, err := d2.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout)
	if err != nil {
		t.Fatalf("Shutdown of the recovered VM: %s", describe(err))
	}
	if !graceful {
		t.Errorf("Shutdown of the recovered VM returned graceful=false: the guest must power off by itself")
	}
	if m := s.guest.PoweroffMarker; m != "" {
		if err := cs.out.WaitFor(s.ctx(t), m, 1, 10*time.Second); err != nil {
			t.Errorf("the recovered guest did not show that it powered off: %v", err)
		}
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_STOPPED, "Shutdown of the recovered VM")
}

// checkStorageNotAnImage: a containerDisk whose base is not a disk image is InvalidArgument
// naming the volume, and a failed Prepare leaves nothing behind.
func (s *vmSuite) checkStorageNotAnImage(t T) {
	d, caps := s.storage(t)
	if !slices.Contains(caps.GetVolumeTypes(), "containerDisk") {
		t.Skipf("storage driver does not declare volume type containerDisk")
	}
	base := filepath.Join(t.TempDir(), "not-an-image.img")
	text := strings.Repeat("This is a text file, not a disk image.\n", 100)
	if err := os.WriteFile(base, []byte(text), 0o600); err != nil {
		t.Fatalf("make a text file: %v", err)
	}
	const bad = "conformance-notanimage"
	r := newRequest(t)
	if v := simpleVolume(caps, "scratch"); v != nil {
		// Made first, so that the failed Prepare has something to undo.
		r.volumes = append(r.volumes, v)
	}
	r.volumes = append(r.volumes, &storagev1.Volume{Name: bad, Source: &storagev1.Volume_ContainerDisk{
		ContainerDisk: &storagev1.ContainerDisk{Image: "example.com/not-an-image:latest", Path: base},
	}})
	s.expectPrepareRefused(t, d, r, bad, "Prepare of a containerDisk whose base is a text file")
}
