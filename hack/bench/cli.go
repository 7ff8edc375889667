package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitFail  = 1
	ExitUsage = 2
)

const usage = `usage: kubevisor-bench boot|memory|controlplane|e2e|console-latency|start|migrate [flags]

boot times the test guest (make guest) from start to its console marker, with raw
qemu-system-x86_64 running the command line the qmp driver builds (less -S), with the same
VM through the qmp driver plugin (bin/kubevisor-driver-qmp, started by the Kubevisor plugin
host) and, with --driver libvirt=PATH, through the libvirt driver plugin (a libvirtd per VM,
started through a kubevisor-launcher); it prints each run, the medians and their ratios. Then
it boots VMs through each plugin (--vms) and prints the drivers' memory per running VM beyond
QEMU (libvirt's per-VM daemon counted), by RSS and PSS. "kubevisor-bench boot -h" lists its
flags.

memory boots 1, 5 and 10 VMs of the test guest through a node handler and the qmp, cni and
local driver plugins, each in a sandbox of its own (a network namespace and a
kubevisor-launcher, as kubevisor-handler run makes it), and prints per running VM the RSS of
QEMU, of the launcher, and the handler's and the drivers' share, against the aim of at most
25 MiB per VM beyond QEMU. Needs root. "kubevisor-bench memory -h" lists its flags.

controlplane creates 1,000 VMIs against a real kube-apiserver and etcd with kubevisor-controller's
manager in this process, and prints the rate at which they become launcher pods and the API
requests the control plane made per VMI. "kubevisor-bench controlplane -h" lists its flags.

e2e creates 20 VMIs of the test guest at once on a cluster where Kubevisor is installed (make up),
from one of its nodes, and prints the P50/P95 of creation to Running and to the console marker,
the memory per VM on the node beyond QEMU, and the API requests per VMI counted by the API
server. "kubevisor-bench e2e -h" lists its flags.

console-latency boots one VMI of the test guest on such a cluster, from one of its nodes as root,
and prints the p50/p99 of keystroke to echo on its serial console through the API server (as
vmctl console) and straight to the node handler's stream endpoint (the baseline), their ratio,
and the time from opening vnc to the first FramebufferUpdate on both paths.
"kubevisor-bench console-latency -h" lists its flags.

migrate live-migrates the test guest, idle and dirtying its memory, with raw QEMU to QEMU over
a unix socket and through Kubevisor on the local two-node cluster, alternating, and prints the
hypervisor's total time and downtime, the guest's heartbeat gap seen from the host, Kubevisor's
migration create to Running on the target, medians and ratios Kubevisor/raw.
"kubevisor-bench migrate -h" lists its flags.
`

const memoryUsage = `usage: kubevisor-bench memory [flags]

For each count of --vms: boots that many VMs of the test guest, one after another, through one
node handler (core/handler, in this process) with the qmp, cni and local driver plugins from
--bin-dir, each VM in a sandbox of its own (a network namespace on the bridge --bridge with a
kubevisor-launcher in it, as kubevisor-handler run makes it), waits for each VMI to be Running
and its console to show KUBEVISOR-GUEST-READY, then reads the VmRSS of every QEMU, launcher and
driver plugin process and of this process, stops the VMs and removes their sandboxes. Prints,
per running VM: QEMU's RSS, the launcher's, the handler's share (its RSS beyond this process's
before the handler was made, / N) and the drivers' share (their RSS / N), and the total beyond
QEMU against the aim (at most 25 MiB). Needs root.

Flags:
`

const bootUsage = `usage: kubevisor-bench boot [flags]

Times the test guest from start to KUBEVISOR-GUEST-READY on its serial console: raw
qemu-system-x86_64 (timed from exec) against the same VM through the qmp driver plugin (timed
from just before Create, and from just before Start, to the marker on the driver's Console
stream) and, with --driver libvirt=PATH, through the libvirt driver plugin (timed the same way;
a kubevisor-launcher is started for each VM first, untimed, and the driver starts the VM's
libvirtd through it as user nobody), the order rotating, and prints every run, the medians and
the ratios qmp/raw, libvirt/raw and libvirt/qmp. Then boots --vms VMs through each plugin and
prints the qmp driver's RSS per running VM, and the libvirt driver's, its daemons', launchers'
and QEMUs' RSS and PSS, and both drivers' memory per running VM beyond QEMU.

Flags:
`

// Run runs kubevisor-bench with args (without the program name) and returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	switch args[0] {
	case "boot":
	case "memory":
		return runMemory(args[1:], stdout, stderr)
	case "controlplane":
		return runControlPlane(args[1:], stdout, stderr)
	case "e2e":
		return runE2E(args[1:], stdout, stderr)
	case "console-latency":
		return runConsole(args[1:], stdout, stderr)
	case "start":
		return runStart(args[1:], stdout, stderr)
	case "migrate":
		return runMigrate(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "kubevisor-bench: unknown command %q\n%s", args[0], usage)
		return ExitUsage
	}
	cfg := BootConfig{}
	fs := newBootFlags(&cfg, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench boot: %v\n", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunBoot(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench boot: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

func newBootFlags(cfg *BootConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kubevisor-bench boot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, bootUsage)
		fs.PrintDefaults()
	}
	cfg.VMs = DefaultVMs
	fs.StringVar(&cfg.GuestDir, "guest-dir", "_output/guest", "`directory` of the test guest, as make guest builds it")
	cfg.Driver = "bin/kubevisor-driver-qmp"
	fs.Var(&driversFlag{cfg: cfg}, "driver", "hypervisor driver plugin `NAME=PATH`, once per driver: qmp=PATH (a bare PATH is qmp's; default bin/kubevisor-driver-qmp) and libvirt=PATH (adds the libvirt arm)")
	fs.StringVar(&cfg.Launcher, "launcher", "", "kubevisor-launcher `binary` the libvirt arm starts per VM (default: $KUBEVISOR_LAUNCHER, next to this program, or on PATH)")
	fs.StringVar(&cfg.QEMU, "qemu", "", "qemu-system-x86_64 `binary` of the raw runs (default: from PATH, as the driver finds it)")
	fs.StringVar(&cfg.QemuImg, "qemu-img", "qemu-img", "qemu-img `binary`, which makes the overlay disks")
	fs.IntVar(&cfg.Runs, "runs", DefaultRuns, "measured pairs of a raw and a plugin boot")
	fs.IntVar(&cfg.Warmup, "warmup", DefaultWarmup, "warm-up pairs before them, not counted")
	fs.Var((*intsFlag)(&cfg.VMs), "vms", "comma-separated `counts` of VMs running through the plugin at which the driver's RSS is read (\"\" skips)")
	fs.Uint64Var(&cfg.MemoryBytes, "memory", DefaultMemoryBytes, "guest memory of each VM in `bytes`")
	fs.DurationVar(&cfg.BootTimeout, "boot-timeout", DefaultBootTimeout, "how long one boot (or the boot of --vms VMs at once) may take")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "`directory` for the VMs' run directories and the plugin host's state (default: a temporary one in /tmp, removed)")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "`level` of the plugin host's and the driver's logs on stderr (trace, debug, info, warn, error, off)")
	return fs
}

func (cfg *BootConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q", rest)
	case cfg.Runs < 1:
		return fmt.Errorf("--runs: %d, want at least 1", cfg.Runs)
	case cfg.Warmup < 0:
		return fmt.Errorf("--warmup: %d, want 0 or more", cfg.Warmup)
	case cfg.MemoryBytes < 64<<20:
		return fmt.Errorf("--memory: %d bytes is too little for the guest (at least 64 MiB)", cfg.MemoryBytes)
	case cfg.BootTimeout <= 0:
		return errors.New("--boot-timeout: must be positive")
	case hclog.LevelFromString(cfg.LogLevel) == hclog.NoLevel:
		return fmt.Errorf("--log-level: unknown level %q", cfg.LogLevel)
	}
	return nil
}

// intsFlag is a comma-separated list of positive counts, increasing.
type intsFlag []int

func (f *intsFlag) String() string {
	if f == nil {
		return ""
	}
	s := make([]string, len(*f))
	for i, n := range *f {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (f *intsFlag) Set(v string) error {
	var out []int
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive count", p)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return fmt.Errorf("counts must increase: %d after %d", n, out[len(out)-1])
		}
		out = append(out, n)
	}
	*f = out
	return nil
}

func runMemory(args []string, stdout, stderr io.Writer) int {
	cfg := MemoryConfig{}
	fs := newMemoryFlags(&cfg, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench memory: %v\n", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunMemory(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench memory: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

func newMemoryFlags(cfg *MemoryConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kubevisor-bench memory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, memoryUsage)
		fs.PrintDefaults()
	}
	cfg.VMs = DefaultMemoryVMs
	cfg.MemoryBytes = DefaultMemoryGuestBytes
	fs.StringVar(&cfg.GuestDir, "guest-dir", "_output/guest", "`directory` of the test guest, as make guest builds it")
	fs.StringVar(&cfg.VMI, "vmi", DefaultMemoryVMFile, "VMI `manifest` each VM is made from (its name, UID, memory and containerDisk are replaced)")
	fs.StringVar(&cfg.BinDir, "bin-dir", "bin", "`directory` of kubevisor-launcher and the kubevisor-driver-* plugins")
	fs.Var((*intsFlag)(&cfg.VMs), "vms", "comma-separated increasing `counts` of VMs, one round each")
	fs.Var((*bytesFlag)(&cfg.MemoryBytes), "memory", "guest memory of each VM, a `quantity` (128Mi, 1Gi)")
	fs.DurationVar(&cfg.BootTimeout, "boot-timeout", DefaultMemoryBootTimeout, "how long one VM may take to be Running with its console marker")
	fs.DurationVar(&cfg.GracePeriod, "grace-period", DefaultMemoryGrace, "the VMs' graceful shutdown time at the end of a round")
	fs.StringVar(&cfg.Bridge, "bridge", DefaultMemoryBridge, "host `bridge` of the sandboxes' pod network (removed at the end)")
	fs.StringVar(&cfg.Subnet, "subnet", DefaultMemorySubnet, "IPv4 `subnet` of the pod network")
	fs.StringVar(&cfg.Acceleration, "acceleration", "auto", "the handler's acceleration `policy`: auto (KVM when usable), required (KVM), emulated (TCG)")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "`directory` for the handler's state, run and sandbox directories (default: a temporary one in /tmp, removed)")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "`level` of the handler's and the plugins' logs on stderr (trace, debug, info, warn, error, off)")
	return fs
}

func (cfg *MemoryConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q", rest)
	case len(cfg.VMs) == 0:
		return errors.New("--vms: at least one count")
	case cfg.MemoryBytes < 64<<20:
		return fmt.Errorf("--memory: %d bytes is too little for the guest (at least 64Mi)", cfg.MemoryBytes)
	case cfg.BootTimeout <= 0:
		return errors.New("--boot-timeout: must be positive")
	case cfg.GracePeriod < time.Second:
		return errors.New("--grace-period: at least 1s (the VMI's terminationGracePeriodSeconds)")
	case hclog.LevelFromString(cfg.LogLevel) == hclog.NoLevel:
		return fmt.Errorf("--log-level: unknown level %q", cfg.LogLevel)
	}
	return nil
}

// bytesFlag is a byte count written as a Kubernetes quantity (128Mi, 1Gi, 134217728).
type bytesFlag uint64

func (f *bytesFlag) String() string {
	if f == nil {
		return ""
	}
	return resource.NewQuantity(int64(*f), resource.BinarySI).String()
}

func (f *bytesFlag) Set(v string) error {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil {
		return err
	}
	n, ok := q.AsInt64()
	if !ok || n <= 0 {
		return fmt.Errorf("%q is not a positive whole number of bytes", v)
	}
	*f = bytesFlag(n)
	return nil
}
