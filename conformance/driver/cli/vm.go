package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/plugin"
)

const vmUsage = `usage: kubevisor-conformance vm --hypervisor PATH --storage PATH --guest-dir DIR [flags]
       kubevisor-conformance vm --class FILE --storage PATH --guest-dir DIR [flags]

Boots a real guest with a hypervisor and a storage driver plugin, both started through one
Kubevisor plugin host, and checks what the guest shows on its serial console: boot, cloud-init
user-data, graceful shutdown, kill, pause, reboot, recovery after the hypervisor driver's
process is killed (SIGKILL), a containerDisk that is not an image, and live migration (when the
hypervisor declares it) to a second process of the same plugin with a state directory of its
own (<state dir>/peer), as on another node. Every VM runs under a
kubevisor-launcher of its own, as under the node handler: the hypervisor must start the VM
process through it. The guest is the project's test guest as "make guest" builds it
(_output/guest).

--class FILE takes the hypervisor from a HypervisorClass manifest (YAML or JSON, as installed:
manifests/install/drivers/<driver>/hypervisorclass.yaml): the plugin binary
kubevisor-driver-<driver> in --plugin-dir (default: this program's directory), whose Info must
report that name. Every launcher then runs as in a launcher pod of the class: root with the
class's launcherCapabilities only (needs root and util-linux's setpriv; the kit checks each
launcher's capability sets). A line
says which capabilities the launchers keep. deviceResources, overhead and scheduling take
effect in a cluster only: a line says they are not applied. A class with parameters is refused,
as the API server refuses it. --hypervisor and --hypervisor-name may be given with --class when
they name the class's driver.

Prints a line per check, then "N passed, N failed, N skipped"; exits 1 when a check fails.

Flags:
`

// VMConfig is the configuration of `kubevisor-conformance vm`, one field per flag.
type VMConfig struct {
	// Hypervisor and Storage are the driver plugin binaries.
	Hypervisor, Storage string
	// HypervisorName and StorageName are the drivers' names; empty means the binary's file
	// name without a "kubevisor-driver-" prefix.
	HypervisorName, StorageName string
	// HypervisorArgs and StorageArgs are passed to the plugin binaries.
	HypervisorArgs, StorageArgs []string
	// HypervisorConfig and StorageConfig are files with the drivers' configurations (JSON).
	HypervisorConfig, StorageConfig string
	// Class is a HypervisorClass manifest (YAML or JSON): its driver is the hypervisor (found
	// in PluginDir unless Hypervisor names it, with the class's driver name), and every
	// launcher keeps the class's LauncherCapabilities only.
	Class string
	// PluginDir is where Class's driver binary, kubevisor-driver-<driver>, is; empty means the
	// directory of this executable.
	PluginDir string
	// GuestDir holds the test guest (conformance.GuestFromDir).
	GuestDir string
	// Boot is how the guest boots: "auto" (its kernel when the hypervisor declares firmware
	// kernel, else its disk), "kernel" (the kernel only: no containerDisk) or "disk" (the
	// BIOS booting the containerDisk over its disk image).
	Boot string
	// Machine is the machine type; empty means the hypervisor's default.
	Machine string
	// DiskBus and CDROMBus are the buses of the VM's disks and CD-ROMs.
	DiskBus, CDROMBus string
	// JUnit, when set, is where the JUnit XML report is written.
	JUnit string
	// Run selects checks as `go test -run` does ("Boot", "Pause|Reboot").
	Run string
	// Skip leaves out the checks it matches, as `go test -skip` does ("Migrate").
	Skip string
	// StateDir is the plugin host's state directory; empty means a temporary one.
	StateDir string
	// Timeout bounds each check; BootTimeout each boot of the guest.
	Timeout, BootTimeout time.Duration
	// ShutdownTimeout is the timeout the checks give Shutdown.
	ShutdownTimeout time.Duration
	// Launcher is the kubevisor-launcher binary every VM runs under; empty means the one next to
	// this program, else on PATH (conformance.FindLauncher).
	Launcher string
	// LogLevel is the level of the host's and the plugins' log lines on stderr.
	LogLevel string
	// MigrationRelay, when set, carries the Migrate checks' migrations from source to target
	// (conformance.WithMigrationRelay): a library caller's, no flag.
	MigrationRelay conformance.MigrationRelay

	// class is Class, loaded by applyClass.
	class *v1alpha1.HypervisorClass
}

var diskBuses = map[string]domainv1.DiskBus{
	"virtio": domainv1.DiskBus_DISK_BUS_VIRTIO,
	"sata":   domainv1.DiskBus_DISK_BUS_SATA,
	"scsi":   domainv1.DiskBus_DISK_BUS_SCSI,
	"usb":    domainv1.DiskBus_DISK_BUS_USB,
}

func newVMFlags(cfg *VMConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kubevisor-conformance vm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, vmUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Hypervisor, "hypervisor", "", "hypervisor driver plugin `binary` (required unless --class)")
	fs.StringVar(&cfg.Class, "class", "", "HypervisorClass manifest `file` (YAML or JSON): its driver is the hypervisor, and the launchers keep its launcherCapabilities only")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", "", "`directory` holding kubevisor-driver-<driver> of --class (default: this program's)")
	fs.StringVar(&cfg.HypervisorName, "hypervisor-name", "", "hypervisor driver `name` (default: the binary's name without \"kubevisor-driver-\")")
	fs.Var((*stringsFlag)(&cfg.HypervisorArgs), "hypervisor-arg", "`argument` for the hypervisor plugin binary (repeatable)")
	fs.StringVar(&cfg.HypervisorConfig, "hypervisor-config", "", "`file` with the hypervisor driver's configuration (JSON)")
	fs.StringVar(&cfg.Storage, "storage", "", "storage driver plugin `binary` (required)")
	fs.StringVar(&cfg.StorageName, "storage-name", "", "storage driver `name` (default: the binary's name without \"kubevisor-driver-\")")
	fs.Var((*stringsFlag)(&cfg.StorageArgs), "storage-arg", "`argument` for the storage plugin binary (repeatable)")
	fs.StringVar(&cfg.StorageConfig, "storage-config", "", "`file` with the storage driver's configuration (JSON)")
	fs.StringVar(&cfg.GuestDir, "guest-dir", "", "`directory` of the test guest, as make guest builds it (required)")
	fs.StringVar(&cfg.Boot, "boot", "auto", "how the guest boots: auto, kernel or disk")
	fs.StringVar(&cfg.Machine, "machine", "", "machine `type` (default: the hypervisor's)")
	fs.StringVar(&cfg.DiskBus, "disk-bus", "virtio", "`bus` of the VM's disks: virtio, sata, scsi or usb")
	fs.StringVar(&cfg.CDROMBus, "cdrom-bus", "scsi", "`bus` of the VM's CD-ROMs (the cloud-init seed): sata, scsi or usb")
	fs.StringVar(&cfg.JUnit, "junit", "", "write a JUnit XML report to `file`")
	fs.StringVar(&cfg.Run, "run", "", "run only the checks matching `regexp`, as go test -run")
	fs.StringVar(&cfg.Skip, "skip", "", "leave out the checks matching `regexp`, as go test -skip")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "plugin host state `directory` (default: a temporary one)")
	fs.DurationVar(&cfg.Timeout, "timeout", conformance.DefaultVMTimeout, "how long each check may take")
	fs.DurationVar(&cfg.BootTimeout, "boot-timeout", conformance.DefaultBootTimeout, "how long each boot of the guest may take")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", conformance.DefaultGuestShutdownTimeout, "the timeout the checks give Shutdown")
	fs.StringVar(&cfg.Launcher, "launcher", "", "kubevisor-launcher `binary` each VM runs under, as under the node handler (default: next to this program, else on PATH)")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "`level` of the host's and the plugins' logs on stderr (trace, debug, info, warn, error, off)")
	return fs
}

func runVMCommand(args []string, stdout, stderr io.Writer) int {
	cfg := VMConfig{}
	fs := newVMFlags(&cfg, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance vm: %v\n", err)
		return ExitUsage
	}
	return RunVM(cfg, stdout, stderr)
}

// applyClass loads Class, once, and takes the hypervisor's binary and name from it.
func (cfg *VMConfig) applyClass() error {
	if cfg.Class == "" || cfg.class != nil {
		return nil
	}
	c, err := loadClass(cfg.Class)
	if err != nil {
		return err
	}
	if cfg.Hypervisor, cfg.HypervisorName, err = classDriver(c, cfg.Class, cfg.Hypervisor, cfg.HypervisorName, cfg.PluginDir, "--hypervisor", "--hypervisor-name"); err != nil {
		return err
	}
	cfg.class = c
	return nil
}

func (cfg *VMConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q (pass arguments of the plugins with --hypervisor-arg and --storage-arg)", rest)
	case cfg.PluginDir != "" && cfg.Class == "":
		return errors.New("--plugin-dir is for --class")
	}
	if err := cfg.applyClass(); err != nil {
		return err
	}
	switch {
	case cfg.Hypervisor == "":
		return errors.New("--hypervisor or --class is required")
	case cfg.Storage == "":
		return errors.New("--storage is required")
	case cfg.GuestDir == "":
		return errors.New("--guest-dir is required (make guest builds the test guest into _output/guest)")
	}
	switch cfg.Boot {
	case "auto", "kernel", "disk":
	default:
		return fmt.Errorf("--boot: %q is not auto, kernel or disk", cfg.Boot)
	}
	if _, ok := diskBuses[cfg.DiskBus]; !ok {
		return fmt.Errorf("--disk-bus: %q is not virtio, sata, scsi or usb", cfg.DiskBus)
	}
	if _, ok := diskBuses[cfg.CDROMBus]; !ok || cfg.CDROMBus == "virtio" {
		return fmt.Errorf("--cdrom-bus: %q is not sata, scsi or usb", cfg.CDROMBus)
	}
	if hclog.LevelFromString(cfg.LogLevel) == hclog.NoLevel {
		return fmt.Errorf("--log-level: unknown level %q", cfg.LogLevel)
	}
	if _, err := conformance.NewRecorder(conformance.RecorderConfig{Run: cfg.Run}); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	if _, err := conformance.NewRecorder(conformance.RecorderConfig{Skip: cfg.Skip}); err != nil {
		return fmt.Errorf("--skip: %w", err)
	}
	return nil
}

// guest is the test guest of cfg.GuestDir, booting as cfg.Boot says.
func (cfg *VMConfig) guest() (conformance.Guest, error) {
	g, err := conformance.GuestFromDir(cfg.GuestDir)
	if err != nil {
		return g, err
	}
	switch cfg.Boot {
	case "kernel":
		if g.Kernel == "" {
			return g, fmt.Errorf("--boot kernel: %s holds no %s with %s", cfg.GuestDir, conformance.GuestKernelFile, conformance.GuestInitrdFile)
		}
		g.Disk = ""
	case "disk":
		if g.Disk == "" {
			return g, fmt.Errorf("--boot disk: %s holds no %s", cfg.GuestDir, conformance.GuestDiskFile)
		}
		g.Kernel, g.Initrd, g.Cmdline = "", "", ""
	}
	g.Machine = cfg.Machine
	g.BootTimeout = cfg.BootTimeout
	return g, nil
}

// RunVM runs the VM checks against the two plugins and returns the exit code. Setting up the
// plugins is part of the run: a plugin that does not start, or a guest that is not there, is a
// failed check named "vm".
func RunVM(cfg VMConfig, stdout, stderr io.Writer) int {
	if err := cfg.applyClass(); err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance vm: %v\n", err)
		return ExitUsage
	}
	rec, err := conformance.NewRecorder(conformance.RecorderConfig{Progress: stdout, Run: cfg.Run, Skip: cfg.Skip})
	if err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance vm: --run: %v\n", err)
		return ExitUsage
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "kubevisor-conformance",
		Level:  hclog.LevelFromString(cfg.LogLevel),
		Output: stderr,
	})
	rec.Run("vm", func(t conformance.T) { runVMPlugins(t, cfg, logger, stdout) })
	return finish(rec, "vm", cfg.Run, cfg.JUnit, stdout, stderr)
}

// runVMPlugins starts both plugins on one host and runs the VM checks against them, as the
// suite t.
func runVMPlugins(t conformance.T, cfg VMConfig, logger hclog.Logger, stdout io.Writer) {
	g, err := cfg.guest()
	if err != nil {
		t.Fatalf("the test guest: %v", err)
	}
	hv := manifest(t, cfg.Hypervisor, driver.KindHypervisor, cfg.HypervisorName, cfg.HypervisorArgs, cfg.HypervisorConfig)
	st := manifest(t, cfg.Storage, driver.KindStorage, cfg.StorageName, cfg.StorageArgs, cfg.StorageConfig)
	if hv.Name == st.Name {
		t.Fatalf("both drivers are named %q: name one with --hypervisor-name or --storage-name", hv.Name)
	}
	launcher, err := conformance.FindLauncher(cfg.Launcher)
	if err != nil {
		t.Fatalf("--launcher: %v", err)
	}
	host, stateDir := newHost(t, cfg.StateDir, logger)
	startPlugin(t, host, hv, cfg.Timeout, cfg.Class)
	startPlugin(t, host, st, cfg.Timeout, "")
	fmt.Fprintf(stdout, "=== hypervisor %s: %s %s\n", hv.Name, hv.Binary, strings.Join(hv.Args, " "))
	fmt.Fprintf(stdout, "=== storage %s: %s %s\n", st.Name, st.Binary, strings.Join(st.Args, " "))
	boot := "kernel " + g.Kernel
	if g.Kernel == "" {
		boot = "disk " + g.Disk
	} else if g.Disk != "" {
		boot += ", or disk " + g.Disk
	}
	fmt.Fprintf(stdout, "=== guest: %s\n", boot)
	fmt.Fprintf(stdout, "=== launcher: %s\n", launcher)
	var extraOpts []conformance.Option
	if cfg.class != nil {
		printClass(stdout, cfg.Class, cfg.class, true)
		extraOpts = append(extraOpts, launcherCapabilities(cfg.class))
	}
	if cfg.MigrationRelay != nil {
		extraOpts = append(extraOpts, conformance.WithMigrationRelay(cfg.MigrationRelay))
	}

	get := hypervisorOf(host, hv.Name)
	peer, peerStateDir := migrationPeer(t, cfg, hv, logger)
	conformance.VM(t, get, storageOf(host, st.Name), g, append(extraOpts,
		conformance.WithMigrationPeer(peer, peerStateDir),
		conformance.WithConfig(hv.Config),
		conformance.WithStateDir(driverStateDir(stateDir, hv)),
		conformance.WithStorageConfig(st.Config),
		conformance.WithStorageStateDir(driverStateDir(stateDir, st)),
		conformance.WithTimeout(cfg.Timeout),
		conformance.WithShutdownTimeout(cfg.ShutdownTimeout),
		conformance.WithDiskBus(diskBuses[cfg.DiskBus]),
		conformance.WithCDROMBus(diskBuses[cfg.CDROMBus]),
		conformance.WithLauncher(launcher),
		conformance.WithDriverKill(func(t conformance.T) driver.Hypervisor {
			crash(t, host, hv.Name, cfg.Timeout)
			return get(t)
		}),
	)...)
}

// migrationPeer is the second instance of the hypervisor plugin that the Migrate checks move
// VMs to: the same binary and configuration, started on first use by a plugin host of its own
// with its own state directory (<state dir>/peer), as the driver of another node.
func migrationPeer(t conformance.T, cfg VMConfig, hv plugin.Manifest, logger hclog.Logger) (conformance.HypervisorFactory, string) {
	peerState := ""
	if cfg.StateDir != "" {
		peerState = filepath.Join(cfg.StateDir, "peer")
	}
	host, stateDir := newHost(t, peerState, logger.Named("peer"))
	var (
		once    sync.Once
		started bool
	)
	get := hypervisorOf(host, hv.Name)
	return func(ct conformance.T) driver.Hypervisor {
		once.Do(func() {
			startPlugin(ct, host, hv, cfg.Timeout, cfg.Class)
			started = true
		})
		if !started {
			ct.Fatalf("the second instance of the hypervisor plugin did not start")
		}
		return get(ct)
	}, driverStateDir(stateDir, hv)
}
