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

	"github.com/hashicorp/go-hclog"
)

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitFail  = 1
	ExitUsage = 2
)

const usage = `usage: kubevisor-bench boot [flags]

boot times the test guest (make guest) from start to its console marker, with raw
qemu-system-x86_64 running the command line the qmp driver builds (less -S), and with the same
VM through the qmp driver plugin (bin/kubevisor-driver-qmp, started by the Kubevisor plugin
host); it prints each run, the medians and their ratio. Then it boots VMs through the plugin
(--vms) and prints the driver process's RSS per running VM. "kubevisor-bench boot -h" lists
its flags.
`

const bootUsage = `usage: kubevisor-bench boot [flags]

Times the test guest from start to KUBEVISOR-GUEST-READY on its serial console: raw
qemu-system-x86_64 (timed from exec) against the same VM through the qmp driver plugin (timed
from just before Create, and from just before Start, to the marker on the driver's Console
stream), alternating, and prints every run, the medians and the ratio plugin/raw. Then boots
--vms VMs through the plugin and prints the driver process's RSS per running VM.

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
	if args[0] != "boot" {
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
	fs.StringVar(&cfg.Driver, "driver", "bin/kubevisor-driver-qmp", "qmp hypervisor driver plugin `binary`")
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
