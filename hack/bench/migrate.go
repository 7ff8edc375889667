package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// Defaults of `kubevisor-bench migrate`.
const (
	DefaultMigrateRounds  = 3
	DefaultMigrateTimeout = 4 * time.Minute
	// DefaultHeartbeat is the guest's heartbeat period: the e2e specs' heartbeat prints every
	// second; a shorter period resolves the gap more finely (busybox sleep takes fractions).
	DefaultHeartbeat = 100 * time.Millisecond
	// DefaultDirtySettle is how long the guest dirties its memory before the migration starts.
	DefaultDirtySettle = 3 * time.Second
	// migrateBenchLabel marks the bench's VMIs; its value is the bench's namespace, which the
	// bench's MigrationPolicy selects.
	migrateBenchLabel = "kubevisor.io/bench"
	// unlimitedBandwidth is the driver's max-bandwidth without a limit (drivers/qmp).
	rawUnlimitedBandwidth = 1 << 40
	// dirtyCommand is the e2e specs' (conformance/e2e/migration.go): 32 MiB of the guest's
	// memory (a tmpfs file) written over and over.
	dirtyCommand = "while :; do dd if=/dev/zero of=/tmp/kv-dirty bs=1M count=32 2>/dev/null; done &\r"
	// beatsAfter is how many heartbeats the target must print before a round ends.
	beatsAfter = 5
	// watchAfter is how long the target's console is watched for the kernel's reports of
	// trouble (KernelWatcher) once its heartbeats came: a guest whose memory arrived damaged
	// may print a few beats before the kernel trips over it.
	watchAfter = 5 * time.Second
)

// DefaultMigrateHostStates are the host state directories of the local cluster's two nodes as
// this host sees them (hack/cluster/lib.sh: node 2 sees /run/kubevisor at the second path).
var DefaultMigrateHostStates = []string{DefaultE2EHostState, "/run/kubevisor-cluster/node2/kubevisor"}

// heartbeatCommand is the e2e specs' heartbeat (conformance/e2e/subresources.go) with its period.
func heartbeatCommand(period time.Duration) string {
	return fmt.Sprintf("while :; do read -r up idle </proc/uptime; echo HB-$up; sleep %g; done &\r", period.Seconds())
}

// MigrateConfig is the configuration of `kubevisor-bench migrate`, one field per flag.
type MigrateConfig struct {
	Kubeconfig string
	Image      string
	GuestDir   string
	QEMU       string
	QemuImg    string
	HostStates []string
	Rounds     int
	Modes      []string
	Heartbeat  time.Duration
	Settle     time.Duration
	Timeout    time.Duration
	// RawOnly runs the raw side alone (no cluster needed).
	RawOnly bool
	// RawDisks makes the raw side copy the containerDisk overlay's top as Kubevisor does.
	RawDisks bool
	// TCGTranslationCacheMiB is the raw side's tb-size under TCG: the qmp driver's default
	// unless set; 0 is QEMU's own default.
	TCGTranslationCacheMiB int
}

const migrateUsage = `usage: kubevisor-bench migrate [flags]

Live-migrates the test guest, idle and then dirtying its memory (the e2e specs' dd loop), with
raw QEMU (two qemu-system-x86_64 on this host, the qmp driver's command line, the target with
-incoming defer, migrate-incoming and migrate over a unix socket, the driver's capabilities and
max-bandwidth) and through Kubevisor on the local two-node cluster (a VMI, a
VirtualMachineInstanceMigration), the order alternating per round. Both sides: pre-copy, no
bandwidth limit, no auto-converge (a MigrationPolicy selecting the bench's VMIs says so).
Prints per round and the medians: the hypervisor's total time and downtime (QEMU's own figures,
through the Migrated event on the Kubevisor side), the guest's heartbeat gap from host-side
arrival times of its serial console lines, Kubevisor's time from creating the migration to the
VMI Running on the target, and the ratios Kubevisor/raw. Run on the node as root.

Flags:
`

func runMigrate(args []string, stdout, stderr io.Writer) int {
	cfg := MigrateConfig{HostStates: DefaultMigrateHostStates, Modes: []string{"idle", "dirty"}, RawDisks: true, TCGTranslationCacheMiB: qmp.DefaultTCGTranslationCacheMiB}
	fs := flag.NewFlagSet("kubevisor-bench migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, migrateUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin `kubeconfig` of the cluster")
	fs.StringVar(&cfg.Image, "image", DefaultE2EImage, "containerDisk `image` of the test guest")
	fs.StringVar(&cfg.GuestDir, "guest", "_output/guest", "`directory` of the test guest (make guest), for the raw runs")
	fs.StringVar(&cfg.QEMU, "qemu", "qemu-system-x86_64", "QEMU `binary` of the raw runs")
	fs.StringVar(&cfg.QemuImg, "qemu-img", "qemu-img", "qemu-img `binary` for the raw runs' overlays")
	fs.Func("host-states", "comma-separated Kubevisor state `directories` of the nodes as this host sees them (default "+strings.Join(DefaultMigrateHostStates, ",")+")", func(s string) error {
		cfg.HostStates = strings.Split(s, ",")
		return nil
	})
	fs.Func("modes", "comma-separated `modes`: idle, dirty (default idle,dirty)", func(s string) error {
		cfg.Modes = nil
		for m := range strings.SplitSeq(s, ",") {
			if m != "idle" && m != "dirty" {
				return fmt.Errorf("unknown mode %q", m)
			}
			cfg.Modes = append(cfg.Modes, m)
		}
		return nil
	})
	fs.IntVar(&cfg.Rounds, "rounds", DefaultMigrateRounds, "`rounds` per mode, each a raw and a Kubevisor migration")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", DefaultHeartbeat, "the guest's heartbeat `period`")
	fs.DurationVar(&cfg.Settle, "settle", DefaultDirtySettle, "how long the guest runs its heartbeat (and dirties memory) before the migration")
	fs.IntVar(&cfg.TCGTranslationCacheMiB, "raw-tb-size", cfg.TCGTranslationCacheMiB, "the raw side's translation cache under TCG in `MiB` (QEMU's tb-size; 0: QEMU's default); the default is the qmp driver's")
	fs.BoolVar(&cfg.RawOnly, "raw-only", false, "run the raw QEMU side alone, with no cluster")
	fs.BoolVar(&cfg.RawDisks, "raw-disks", true, "the raw side copies the containerDisk overlay's top before the memory (NBD, blockdev-mirror, pause-before-switchover), as Kubevisor's qmp driver does; false: the memory only")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultMigrateTimeout, "how long one boot or one migration may take")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	switch {
	case len(fs.Args()) > 0:
		fmt.Fprintf(stderr, "kubevisor-bench migrate: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	case cfg.Rounds < 1 || cfg.Timeout <= 0 || cfg.Heartbeat < 10*time.Millisecond || len(cfg.Modes) == 0:
		fmt.Fprintln(stderr, "kubevisor-bench migrate: --rounds must be at least 1, --timeout positive, --heartbeat at least 10ms, --modes not empty")
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunMigrate(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench migrate: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

// migResult is one migration's figures.
type migResult struct {
	Total    time.Duration // the hypervisor's
	Downtime time.Duration // the hypervisor's
	Gap      Gap
	EndToEnd time.Duration // Kubevisor: migration created → VMI Running on the target
	Memory   uint64
	Disks    uint64
	Mode     string
	Route    string
}

// migrator runs one `kubevisor-bench migrate`.
type migrator struct {
	cfg   MigrateConfig
	out   io.Writer
	rc    *rest.Config
	c     client.Client
	cs    kubernetes.Interface
	ns    string
	guest conformance.Guest
	qemu  string
	accel qmp.Accel
	work  string
	seed  string
}

// RunMigrate runs the migration benchmark and prints its figures to out.
func RunMigrate(ctx context.Context, cfg MigrateConfig, out io.Writer) error {
	g, err := conformance.GuestFromDir(cfg.GuestDir)
	if err != nil {
		return fmt.Errorf("test guest: %w", err)
	}
	if g.Disk == "" {
		return fmt.Errorf("test guest: %s has no %s (make guest)", cfg.GuestDir, conformance.GuestDiskFile)
	}
	for _, d := range cfg.HostStates {
		if cfg.RawOnly {
			break
		}
		if _, err := os.Stat(layout.VMIsDir(d)); err != nil {
			return fmt.Errorf("a node's state directory is needed for the console logs (run on the node, as root; --host-states): %w", err)
		}
	}
	m := &migrator{cfg: cfg, out: out, guest: g}
	if m.qemu, err = exec.LookPath(cfg.QEMU); err != nil {
		return fmt.Errorf("qemu: %w (install qemu-system-x86)", err)
	}
	m.accel = qmp.NewProber().Probe(ctx, qmp.ProbeOptions{QEMU: m.qemu}).Best()
	if m.work, err = os.MkdirTemp("/tmp", "kvbench-migrate-"); err != nil {
		return err
	}
	defer os.RemoveAll(m.work)
	if m.seed, err = makeSeed(ctx, m.work); err != nil {
		return err
	}

	if cfg.RawOnly {
		return m.rounds(ctx)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	if m.rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig(); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if m.c, err = client.New(m.rc, client.Options{Scheme: manager.Scheme()}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if m.cs, err = kubernetes.NewForConfig(m.rc); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	var nodes corev1.NodeList
	if err := m.c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	if len(nodes.Items) < 2 {
		return fmt.Errorf("%d node(s): a migration needs two (make up NODES=2)", len(nodes.Items))
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-bench-migrate-", Labels: map[string]string{migrateBenchLabel: "migrate"}}}
	if err := m.c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	m.ns = ns.Name
	defer func() { _ = m.c.Delete(context.Background(), ns) }()
	// Pre-copy only, no bandwidth limit, no auto-converge: the raw side's settings.
	no, zero := false, resource.MustParse("0")
	policy := &v1alpha1.MigrationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: m.ns},
		Spec: v1alpha1.MigrationPolicySpec{
			AllowAutoConverge: &no, AllowPostCopy: &no, BandwidthPerMigration: &zero,
			Selectors: &v1alpha1.MigrationPolicySelectors{VirtualMachineInstanceSelector: v1alpha1.MigrationLabelSelector{migrateBenchLabel: m.ns}},
		},
	}
	if err := m.c.Create(ctx, policy); err != nil {
		return fmt.Errorf("create MigrationPolicy: %w", err)
	}
	defer func() { _ = m.c.Delete(context.Background(), policy) }()

	fmt.Fprintf(out, "kubevisor-bench migrate: test guest %s (128 MiB), raw QEMU with accel %s, Kubevisor in namespace %s on nodes %s and %s; load average %s\n",
		cfg.Image, m.accel, m.ns, nodes.Items[0].Name, nodes.Items[1].Name, loadAvg())
	fmt.Fprintf(out, "  both sides: pre-copy, no bandwidth limit (max-bandwidth %d), no auto-converge, no post-copy (MigrationPolicy %s); heartbeat every %s; %d round(s) per mode, raw and Kubevisor alternating\n",
		int64(rawUnlimitedBandwidth), policy.Name, cfg.Heartbeat, cfg.Rounds)
	fmt.Fprintf(out, "  an emulated guest on QEMU before 9.0 is copied paused on both sides (mode Paused: its TCG loses writes made during a live copy; drivers/qmp/migrate.go), so its downtime is the copy\n")
	return m.rounds(ctx)
}

// rounds runs the rounds of every mode and prints them and the medians.
func (m *migrator) rounds(ctx context.Context) error {
	cfg, out := m.cfg, m.out
	if cfg.RawDisks {
		fmt.Fprintf(out, "  both sides copy the containerDisk overlay's top to the target's fresh overlay of the same image before the memory (NBD over a unix socket, blockdev-mirror sync=top, pause-before-switchover, the mirror completed at the switch-over), as the qmp driver does\n")
	} else {
		fmt.Fprintf(out, "  raw: the guest's memory only, the target opening a fresh overlay of the same image; Kubevisor also mirrors the containerDisk overlay's top before the memory (its disks column)\n")
	}
	fmt.Fprintf(out, "  heartbeat gap: the longest interval between the guest's heartbeat lines by host arrival time (raw: read from each QEMU's serial socket; Kubevisor: from each node's console log file, read every %s, and from the serial console through the API server, vmctl console's path, connected again when it ends or is silent for %s),\n", consoleFilePoll, silentAfter)
	fmt.Fprintf(out, "  each line dated at the earliest its stream proves (a line delivered late, as the target node's console log replays what the guest printed before the handler attached, is dated by a later line's arrival less the guest's uptime between them):\n")
	fmt.Fprintf(out, "  so it is the guest's interruption (the switch-over pause plus the target's resume) plus up to one heartbeat period; \"arrival gap\" is the same without the dating, what a console reader saw\n\n")

	results, failures := map[string][2][]migResult{}, 0
	for _, mode := range cfg.Modes {
		for i := range cfg.Rounds {
			var raw, kv migResult
			var rawErr, kvErr error
			rawRun := func() { raw, rawErr = m.rawRound(ctx, mode, i) }
			kvRun := func() {
				if !cfg.RawOnly {
					kv, kvErr = m.kvRound(ctx, mode, i)
				}
			}
			first, order := "raw", []func(){rawRun, kvRun}
			if i%2 == 1 {
				first, order = "Kubevisor", []func(){kvRun, rawRun}
			}
			for _, f := range order {
				if f(); ctx.Err() != nil {
					return fmt.Errorf("%s round %d: %w", mode, i+1, ctx.Err())
				}
			}
			// A side that failed is reported and left out of the medians; the rounds go on.
			r := results[mode]
			line := fmt.Sprintf("%s %d/%d (%s first): ", mode, i+1, cfg.Rounds, first)
			if rawErr == nil {
				r[0] = append(r[0], raw)
				line += fmt.Sprintf("raw total %s downtime %s gap %s (arrival %s), memory %d MiB, disks %d KiB, %s",
					ms(raw.Total), ms(raw.Downtime), ms(raw.Gap.Guest), ms(raw.Gap.Arrival), raw.Memory>>20, raw.Disks>>10, raw.Mode)
			} else {
				failures++
				line += fmt.Sprintf("raw FAILED: %v", rawErr)
			}
			if !cfg.RawOnly {
				if kvErr == nil {
					r[1] = append(r[1], kv)
					line += fmt.Sprintf(" | Kubevisor total %s downtime %s gap %s (arrival %s) create→running %s, memory %d MiB, disks %d KiB, %s, %s",
						ms(kv.Total), ms(kv.Downtime), ms(kv.Gap.Guest), ms(kv.Gap.Arrival), ms(kv.EndToEnd), kv.Memory>>20, kv.Disks>>10, kv.Mode, kv.Route)
				} else {
					failures++
					line += fmt.Sprintf(" | Kubevisor FAILED: %v", kvErr)
				}
			}
			results[mode] = r
			fmt.Fprintln(out, line)
		}
	}
	m.summary(results)
	if failures > 0 {
		return fmt.Errorf("%d round(s) failed", failures)
	}
	return nil
}

// summary prints the medians and ratios per mode.
func (m *migrator) summary(results map[string][2][]migResult) {
	fmt.Fprintf(m.out, "\nmedians of the migrations that succeeded (of %d per mode and side):\n", m.cfg.Rounds)
	tab := table{w: m.out, widths: []int{22, 11, 11, 15, 13, 17}}
	tab.row("", "total", "downtime", "heartbeat gap", "arrival gap", "create→running")
	for _, mode := range m.cfg.Modes {
		r := results[mode]
		med := func(xs []migResult, f func(migResult) time.Duration) time.Duration { return Median(column(xs, f)) }
		total := func(x migResult) time.Duration { return x.Total }
		down := func(x migResult) time.Duration { return x.Downtime }
		gap := func(x migResult) time.Duration { return x.Gap.Guest }
		arr := func(x migResult) time.Duration { return x.Gap.Arrival }
		e2e := func(x migResult) time.Duration { return x.EndToEnd }
		tab.row(fmt.Sprintf("%s raw (%d)", mode, len(r[0])), ms(med(r[0], total)), ms(med(r[0], down)), ms(med(r[0], gap)), ms(med(r[0], arr)), "-")
		if m.cfg.RawOnly {
			continue
		}
		tab.row(fmt.Sprintf("%s Kubevisor (%d)", mode, len(r[1])), ms(med(r[1], total)), ms(med(r[1], down)), ms(med(r[1], gap)), ms(med(r[1], arr)), ms(med(r[1], e2e)))
		tab.row(mode+" Kubevisor/raw", ratio(med(r[1], total), med(r[0], total)), ratio(med(r[1], down), med(r[0], down)),
			ratio(med(r[1], gap), med(r[0], gap)), ratio(med(r[1], arr), med(r[0], arr)), "-")
	}
	fmt.Fprintln(m.out, "(total and downtime: QEMU's own figures of the source, query-migrate's total-time and downtime: create→running: Kubevisor's migration object created → the VMI Running on the target node with the target pod, which raw QEMU has no counterpart of)")
}

// makeSeed makes the raw runs' cloud-init ISO (read-only, shared by both QEMUs).
func makeSeed(ctx context.Context, work string) (string, error) {
	if _, err := exec.LookPath("genisoimage"); err != nil {
		return "", fmt.Errorf("genisoimage makes the raw runs' seed: %w (install genisoimage)", err)
	}
	seedDir, iso := filepath.Join(work, "seed"), filepath.Join(work, "seed.iso")
	if err := os.MkdirAll(seedDir, 0o700); err != nil {
		return "", err
	}
	for name, text := range map[string]string{
		"user-data": "#cloud-config\n# kubevisor-bench migrate, raw run\n",
		"meta-data": "instance-id: raw-migrate\nlocal-hostname: raw\n",
	} {
		if err := os.WriteFile(filepath.Join(seedDir, name), []byte(text), 0o600); err != nil {
			return "", err
		}
	}
	if out, err := exec.CommandContext(ctx, "genisoimage", "-quiet", "-V", "cidata", "-J", "-r", "-o", iso, seedDir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("seed ISO: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return iso, nil
}

// rawVM is one raw QEMU of a round.
type rawVM struct {
	runDir string
	cmd    *exec.Cmd
	exited chan struct{}
	serial net.Conn
	mon    qmp.Monitor
	events chan string // MIGRATION statuses
	beats  *BeatRecorder
	marker *MarkerWatcher
	kernel *KernelWatcher
}

// startRaw starts QEMU with the qmp driver's command line for the guest in runDir (a migration
// target when incoming), connects to its serial console and QMP.
func (m *migrator) startRaw(ctx context.Context, runDir, incoming, disksSocket string) (*rawVM, error) {
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, err
	}
	overlay := filepath.Join(runDir, overlayFile)
	if out, err := exec.CommandContext(ctx, m.cfg.QemuImg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", m.guest.Disk, overlay).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create overlay: %w: %s", err, strings.TrimSpace(string(out)))
	}
	// As start.go's raw runs: the VMI's disks (containerDisk, cloud-init), its serial console.
	spec := &domainv1.DomainSpec{
		Id: "raw", Name: "kubevisor-bench/raw-migrate",
		Memory:   &domainv1.Memory{GuestBytes: 128 << 20},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}},
		Disks: []*domainv1.Disk{
			{Name: "containerdisk", Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, BootOrder: 1},
			{Name: "cloudinitdisk", Path: m.seed, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
		},
		Serial: &domainv1.Serial{SocketPath: filepath.Join(runDir, serialSocket)},
		RunDir: runDir,
	}
	if incoming != "" {
		spec.IncomingMigration = &domainv1.IncomingMigration{SocketPath: incoming}
		if disksSocket != "" {
			spec.IncomingMigration.DisksSocketPath, spec.IncomingMigration.Disks = disksSocket, []string{"containerdisk"}
		}
	}
	cl, err := qmp.BuildArgs(spec, qmp.HostEnv{Accel: m.accel, RunDir: runDir, TCGTranslationCacheMiB: m.cfg.TCGTranslationCacheMiB})
	if err != nil {
		return nil, fmt.Errorf("build the raw command line: %w", err)
	}
	args := cl.Args
	if incoming == "" {
		// The source runs at once; the target waits with -S, as the driver's, until `cont`.
		if args, err = RawArgs(cl.Args); err != nil {
			return nil, err
		}
	}
	args = append(args, "-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0")
	logf, err := os.OpenFile(filepath.Join(runDir, "qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	v := &rawVM{runDir: runDir, exited: make(chan struct{}), events: make(chan string, 64)}
	v.cmd = exec.Command(m.qemu, args...)
	v.cmd.Stdout, v.cmd.Stderr = logf, logf
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("raw qemu: %w", err)
	}
	go func() {
		_ = v.cmd.Wait()
		close(v.exited)
	}()
	fail := func(err error) (*rawVM, error) {
		v.stop()
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if v.serial, err = dialSerial(dctx, filepath.Join(runDir, serialSocket), v.exited); err != nil {
		return fail(fmt.Errorf("raw qemu: serial console: %w: %s", err, tail(filepath.Join(runDir, "qemu.log"))))
	}
	v.beats = NewBeatRecorder(filepath.Base(runDir))
	v.marker = NewMarkerWatcher(m.guest.ReadyMarker)
	v.kernel = &KernelWatcher{}
	go func() { _, _ = io.Copy(io.MultiWriter(v.beats, v.marker, v.kernel), v.serial) }()
	for {
		if v.mon, err = qmp.DialQMP(dctx, qmp.RunPaths(spec, runDir).QMP); err == nil {
			break
		}
		select {
		case <-dctx.Done():
			return fail(fmt.Errorf("raw qemu: qmp: %w", err))
		case <-time.After(dialInterval):
		}
	}
	go func() {
		// Drained always: QEMU's replies queue behind undelivered events.
		for ev := range v.mon.Events() {
			if ev.Event == "MIGRATION" {
				if s, ok := ev.Data["status"].(string); ok {
					select {
					case v.events <- s:
					default:
					}
				}
			}
		}
	}()
	return v, nil
}

func (v *rawVM) stop() {
	if v.mon != nil {
		_ = v.mon.Close()
	}
	if v.serial != nil {
		_ = v.serial.Close()
	}
	_ = v.cmd.Process.Kill()
	<-v.exited
}

// capabilities sets migrate-set-capabilities.
func (v *rawVM) capabilities(ctx context.Context, caps map[string]bool) error {
	var list []map[string]any
	for k, on := range caps {
		list = append(list, map[string]any{"capability": k, "state": on})
	}
	_, err := v.mon.Run(ctx, "migrate-set-capabilities", map[string]any{"capabilities": list})
	return err
}

// rawRound migrates the guest from one raw QEMU to another over a unix socket.
func (m *migrator) rawRound(ctx context.Context, mode string, i int) (migResult, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	dir := filepath.Join(m.work, fmt.Sprintf("raw-%s-%d", mode, i))
	defer os.RemoveAll(dir)
	src, err := m.startRaw(ctx, filepath.Join(dir, "source"), "", "")
	if err != nil {
		return migResult{}, err
	}
	defer src.stop()
	select {
	case <-src.marker.Found():
	case <-src.exited:
		return migResult{}, fmt.Errorf("raw source exited: %s", tail(filepath.Join(src.runDir, "qemu.log")))
	case <-ctx.Done():
		return migResult{}, fmt.Errorf("raw source: no %s: %w; console: %q", m.guest.ReadyMarker, ctx.Err(), src.marker.Tail())
	}
	if err := m.startLoad(ctx, src.serial, mode, func() int { return len(src.beats.Beats()) }); err != nil {
		return migResult{}, fmt.Errorf("raw source: %w; console: %q", err, src.marker.Tail())
	}
	sock := filepath.Join(dir, "target", "migrate.sock")
	disksSock := ""
	if m.cfg.RawDisks {
		disksSock = filepath.Join(dir, "target", "disks.sock")
	}
	dst, err := m.startRaw(ctx, filepath.Join(dir, "target"), sock, disksSock)
	if err != nil {
		return migResult{}, err
	}
	defer dst.stop()
	// The driver's settings (drivers/qmp/migrate.go), post-copy and auto-converge not allowed.
	if err := dst.capabilities(ctx, map[string]bool{"events": true, "postcopy-ram": false}); err != nil {
		return migResult{}, fmt.Errorf("target capabilities: %w", err)
	}
	if disksSock != "" {
		// The target serves its overlay over NBD (the driver's serveIncomingDisks).
		if _, err := dst.mon.Run(ctx, "nbd-server-start", map[string]any{"addr": map[string]any{"type": "unix", "data": map[string]any{"path": disksSock}}}); err != nil {
			return migResult{}, fmt.Errorf("nbd-server-start: %w", err)
		}
		if _, err := dst.mon.Run(ctx, "block-export-add", map[string]any{"type": "nbd", "id": "bench-export0", "node-name": "disk0", "name": "containerdisk", "writable": true}); err != nil {
			return migResult{}, fmt.Errorf("block-export-add: %w", err)
		}
	}
	if _, err := dst.mon.Run(ctx, "migrate-incoming", map[string]any{"uri": "unix:" + sock}); err != nil {
		return migResult{}, fmt.Errorf("migrate-incoming: %w", err)
	}
	if err := src.capabilities(ctx, map[string]bool{"events": true, "return-path": true, "auto-converge": false, "postcopy-ram": false, "pause-before-switchover": disksSock != ""}); err != nil {
		return migResult{}, fmt.Errorf("source capabilities: %w", err)
	}
	if _, err := src.mon.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(rawUnlimitedBandwidth)}); err != nil {
		return migResult{}, fmt.Errorf("max-bandwidth: %w", err)
	}
	var diskBytes uint64
	if disksSock != "" {
		// The driver's startMirrors and watchDisks: the overlay's top mirrored until in sync.
		if _, err := src.mon.Run(ctx, "blockdev-add", map[string]any{"driver": "nbd", "node-name": "bench-nbd0", "export": "containerdisk",
			"server": map[string]any{"type": "unix", "path": disksSock}}); err != nil {
			return migResult{}, fmt.Errorf("blockdev-add nbd: %w", err)
		}
		if _, err := src.mon.Run(ctx, "blockdev-mirror", map[string]any{"job-id": "bench-mirror0", "device": "disk0", "target": "bench-nbd0", "sync": "top", "auto-dismiss": false}); err != nil {
			return migResult{}, fmt.Errorf("blockdev-mirror: %w", err)
		}
		for {
			j, err := mirrorJob(ctx, src.mon)
			if err != nil {
				return migResult{}, err
			}
			if j.Error != "" || j.Status == "concluded" {
				return migResult{}, fmt.Errorf("the mirror ended before it was in sync: %s %s", j.Status, j.Error)
			}
			if j.Ready {
				break
			}
			select {
			case <-ctx.Done():
				return migResult{}, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	// The driver's paused copy where it makes one (drivers/qmp/migrate.go).
	paused := qmp.PausesMigration(ctx, src.mon, m.accel)
	if paused {
		if _, err := src.mon.Run(ctx, "stop", nil); err != nil {
			return migResult{}, fmt.Errorf("stop: %w", err)
		}
	}
	if _, err := src.mon.Run(ctx, "migrate", map[string]any{"uri": "unix:" + sock}); err != nil {
		return migResult{}, fmt.Errorf("migrate: %w", err)
	}
	// The source: at pre-switchover the mirror is completed and the migration continued (the
	// driver's switchOver); the target: `cont` once its incoming migration completed.
	for done := false; !done; {
		select {
		case s := <-src.events:
			if s != "pre-switchover" {
				continue
			}
			if _, err := src.mon.Run(ctx, "block-job-cancel", map[string]any{"device": "bench-mirror0"}); err != nil {
				return migResult{}, fmt.Errorf("complete the mirror: %w", err)
			}
			for {
				j, err := mirrorJob(ctx, src.mon)
				if err != nil {
					return migResult{}, err
				}
				if j.Status == "concluded" {
					if j.Error != "" {
						return migResult{}, fmt.Errorf("the mirror failed: %s", j.Error)
					}
					diskBytes = j.Offset
					break
				}
				select {
				case <-ctx.Done():
					return migResult{}, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			if _, err := src.mon.Run(ctx, "job-dismiss", map[string]any{"id": "bench-mirror0"}); err != nil {
				return migResult{}, fmt.Errorf("job-dismiss: %w", err)
			}
			if _, err := src.mon.Run(ctx, "blockdev-del", map[string]any{"node-name": "bench-nbd0"}); err != nil {
				return migResult{}, fmt.Errorf("blockdev-del: %w", err)
			}
			if _, err := src.mon.Run(ctx, "migrate-continue", map[string]any{"state": "pre-switchover"}); err != nil {
				return migResult{}, fmt.Errorf("migrate-continue: %w", err)
			}
		case s := <-dst.events:
			switch s {
			case "completed":
				if _, err := dst.mon.Run(ctx, "cont", nil); err != nil {
					return migResult{}, fmt.Errorf("target cont: %w", err)
				}
				if disksSock != "" {
					if _, err := dst.mon.Run(ctx, "nbd-server-stop", nil); err != nil {
						return migResult{}, fmt.Errorf("target nbd-server-stop: %w", err)
					}
				}
				done = true
			case "failed", "cancelled":
				return migResult{}, fmt.Errorf("the target's migration %s: %s", s, tail(filepath.Join(dst.runDir, "qemu.log")))
			}
		case <-dst.exited:
			return migResult{}, fmt.Errorf("raw target exited: %s", tail(filepath.Join(dst.runDir, "qemu.log")))
		case <-ctx.Done():
			_, _ = src.mon.Run(context.Background(), "migrate_cancel", nil)
			return migResult{}, fmt.Errorf("the migration did not complete: %w", ctx.Err())
		}
	}
	var res migResult
	for {
		raw, err := src.mon.Run(ctx, "query-migrate", nil)
		if err != nil {
			return migResult{}, fmt.Errorf("query-migrate: %w", err)
		}
		var q struct {
			Status    string `json:"status"`
			TotalTime int64  `json:"total-time"`
			Downtime  int64  `json:"downtime"`
			RAM       struct {
				Transferred uint64 `json:"transferred"`
			} `json:"ram"`
		}
		if err := json.Unmarshal(raw, &q); err != nil {
			return migResult{}, fmt.Errorf("query-migrate: %w", err)
		}
		if q.Status == "completed" {
			res = migResult{Total: time.Duration(q.TotalTime) * time.Millisecond, Downtime: time.Duration(q.Downtime) * time.Millisecond,
				Memory: q.RAM.Transferred, Disks: diskBytes, Mode: map[bool]string{false: "PreCopy", true: "Paused"}[paused], Route: "raw"}
			break
		}
		if q.Status == "failed" || q.Status == "cancelled" {
			return migResult{}, fmt.Errorf("the source's migration %s", q.Status)
		}
		select {
		case <-ctx.Done():
			return migResult{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := waitBeats(ctx, func() []Beat { return dst.beats.Beats() }, beatsAfter); err != nil {
		return migResult{}, fmt.Errorf("raw target: %w; console: %q", err, dst.marker.Tail())
	}
	if err := watchKernel(ctx, dst.kernel, src.kernel); err != nil {
		return res, fmt.Errorf("raw target: %w", err)
	}
	res.Gap, err = HeartbeatGap(append(src.beats.Beats(), dst.beats.Beats()...))
	return res, err
}

// mirrorJob is the bench's mirror job in query-block-jobs.
func mirrorJob(ctx context.Context, mon qmp.Monitor) (blockJob, error) {
	raw, err := mon.Run(ctx, "query-block-jobs", nil)
	if err != nil {
		return blockJob{}, fmt.Errorf("query-block-jobs: %w", err)
	}
	var jobs []blockJob
	if err := json.Unmarshal(raw, &jobs); err != nil {
		return blockJob{}, fmt.Errorf("query-block-jobs: %w", err)
	}
	for _, j := range jobs {
		if j.Device == "bench-mirror0" {
			return j, nil
		}
	}
	return blockJob{}, errors.New("the mirror job is gone")
}

// blockJob is what the bench reads of query-block-jobs.
type blockJob struct {
	Device string `json:"device"`
	Offset uint64 `json:"offset"`
	Ready  bool   `json:"ready"`
	Status string `json:"status"`
	Error  string `json:"error"`
}

// startLoad types the heartbeat (and the dirtying loop) on a guest's console, waits for three
// beats and then the settle time.
func (m *migrator) startLoad(ctx context.Context, console io.Writer, mode string, beats func() int) error {
	cmds := []string{"\r", heartbeatCommand(m.cfg.Heartbeat)}
	if mode == "dirty" {
		cmds = append(cmds, dirtyCommand)
	}
	for _, c := range cmds {
		if _, err := io.WriteString(console, c); err != nil {
			return fmt.Errorf("type on the console: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(30 * time.Second)
	for beats() < 3 {
		if time.Now().After(deadline) {
			return errors.New("no heartbeat")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(m.cfg.Settle):
	}
	return nil
}

// watchKernel watches the consoles for watchAfter and fails with the first kernel's report of
// trouble any of them shows.
func watchKernel(ctx context.Context, ws ...*KernelWatcher) error {
	deadline := time.Now().Add(watchAfter)
	for {
		for _, w := range ws {
			if t := w.Trouble(); t != nil {
				return fmt.Errorf("the guest's kernel reported trouble after the migration: %q", t)
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitBeats waits until beats gives at least n beats.
func waitBeats(ctx context.Context, beats func() []Beat, n int) error {
	deadline := time.Now().Add(time.Minute)
	for len(beats()) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d heartbeat(s) after the migration in a minute, want %d", len(beats()), n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// consoleFollower reads a VMI's console log file on one node as it grows, into a recorder.
type consoleFollower struct {
	path   string
	beats  *BeatRecorder
	marker *MarkerWatcher
	kernel *KernelWatcher

	mu     sync.Mutex
	read   int64
	opened int
}

// describe says what the follower read, for a message.
func (f *consoleFollower) describe() string {
	f.mu.Lock()
	read, opened := f.read, f.opened
	f.mu.Unlock()
	st := "absent"
	if fi, err := os.Stat(f.path); err == nil {
		st = fmt.Sprintf("%d bytes", fi.Size())
	}
	return fmt.Sprintf("%s (%s now): %d bytes read from %d file(s), %d beats, ending %q", f.path, st, read, opened, len(f.beats.Beats()), f.marker.Tail())
}

// follow reads the file every consoleFilePoll until ctx ends; a new file at the path (the
// handler attached again, or the VMI came to this node) is read from its start once the old
// one is read to its end.
func (f *consoleFollower) follow(ctx context.Context) {
	var file *os.File
	defer func() {
		if file != nil {
			file.Close()
		}
	}()
	w := io.MultiWriter(f.beats, f.marker, f.kernel)
	buf := make([]byte, 64<<10)
	for ctx.Err() == nil {
		if file == nil {
			if file, _ = os.Open(f.path); file != nil {
				f.mu.Lock()
				f.opened++
				f.mu.Unlock()
			}
		}
		if file != nil {
			for {
				n, _ := file.Read(buf)
				if n == 0 {
					break
				}
				_, _ = w.Write(buf[:n])
				f.mu.Lock()
				f.read += int64(n)
				f.mu.Unlock()
			}
			cur, err1 := file.Stat()
			now, err2 := os.Stat(f.path)
			if err1 == nil && err2 == nil && !os.SameFile(cur, now) {
				file.Close()
				file = nil
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(consoleFilePoll):
		}
	}
}

// apiConsole reads a VMI's serial console through the API server (vmctl console's path) into
// a recorder per connection, and connects again when a connection ends or goes silent (the VMI
// moved to the target node), until ctx ends. The driver replays its backlog to a new console,
// so what the guest printed meanwhile arrives late, in a burst: HeartbeatGap dates it.
type apiConsole struct {
	kernel *KernelWatcher

	mu   sync.Mutex
	recs []*BeatRecorder
}

func (a *apiConsole) beats() []Beat {
	a.mu.Lock()
	defer a.mu.Unlock()
	var bs []Beat
	for _, r := range a.recs {
		bs = append(bs, r.Beats()...)
	}
	return bs
}

// silentAfter is how long a console connection may bring nothing before it is connected again.
const silentAfter = 2 * time.Second

func (a *apiConsole) follow(ctx context.Context, dial func(context.Context) (net.Conn, error), conn net.Conn) {
	for n := 1; ctx.Err() == nil; n++ {
		if conn == nil {
			var err error
			if conn, err = dial(ctx); err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
		}
		rec := NewBeatRecorder(fmt.Sprintf("api-console-%d", n))
		a.mu.Lock()
		a.recs = append(a.recs, rec)
		a.mu.Unlock()
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		buf := make([]byte, 4096)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(silentAfter))
			k, err := conn.Read(buf)
			if k > 0 {
				_, _ = rec.Write(buf[:k])
				_, _ = a.kernel.Write(buf[:k])
			}
			if err != nil {
				break
			}
		}
		stop()
		conn.Close()
		conn = nil
	}
}

// kvRound boots the guest as a VMI, migrates it with a VirtualMachineInstanceMigration, and
// deletes it.
func (m *migrator) kvRound(ctx context.Context, mode string, i int) (res migResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*m.cfg.Timeout)
	defer cancel()
	name := fmt.Sprintf("%s-%d", mode, i)
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.ns, Labels: map[string]string{migrateBenchLabel: m.ns}},
		Spec:       guest.Spec(guest.Options{Image: m.cfg.Image, UserData: "kubevisor-bench migrate " + name}),
	}
	if err := m.c.Create(ctx, vmi); err != nil {
		return res, fmt.Errorf("create VMI: %w", err)
	}
	defer func() {
		if derr := m.deleteVMI(context.WithoutCancel(ctx), vmi); derr != nil && err == nil {
			err = derr
		}
	}()
	fctx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	var followers []*consoleFollower
	for _, d := range m.cfg.HostStates {
		f := &consoleFollower{path: layout.ConsoleLog(d, vmi.UID), beats: NewBeatRecorder(d), marker: NewMarkerWatcher(m.guest.ReadyMarker), kernel: &KernelWatcher{}}
		followers = append(followers, f)
		go f.follow(fctx)
	}
	var api *apiConsole
	rawBeats := func() []Beat {
		var bs []Beat
		for _, f := range followers {
			bs = append(bs, f.beats.Beats()...)
		}
		if api != nil {
			bs = append(bs, api.beats()...)
		}
		return bs
	}
	allBeats := func() []Beat { return distinctBeats(rawBeats()) }
	if _, err := waitRunning(ctx, m.c, vmi.DeepCopy(), m.cfg.Timeout); err != nil {
		return res, err
	}
	// Ready: the console marker, and LiveMigratable.
	for {
		ready := false
		for _, f := range followers {
			select {
			case <-f.marker.Found():
				ready = true
			default:
			}
		}
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := m.c.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err != nil {
			return res, fmt.Errorf("get VMI: %w", err)
		}
		c := v1alpha1.InstanceCondition(cur.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
		if ready && c != nil && c.Status == corev1.ConditionTrue {
			vmi = cur
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("VMI %s: no console marker in %v or not LiveMigratable (%v): %w", name, m.cfg.HostStates, c, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	source := vmi.Status.NodeName
	sp, err := apiPath(m.rc, m.ns, name)
	if err != nil {
		return res, err
	}
	conn, err := sp.dial(ctx, "console")
	if err != nil {
		return res, fmt.Errorf("console: %w", err)
	}
	api = &apiConsole{kernel: &KernelWatcher{}}
	go api.follow(fctx, func(ctx context.Context) (net.Conn, error) { return sp.dial(ctx, "console") }, conn)
	if err := m.startLoad(ctx, conn, mode, func() int { return len(allBeats()) }); err != nil {
		return res, fmt.Errorf("VMI %s: %w", name, err)
	}

	mig := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.ns},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: name},
	}
	created := time.Now()
	if err := m.c.Create(ctx, mig); err != nil {
		return res, fmt.Errorf("create migration: %w", err)
	}
	var state *v1alpha1.VirtualMachineInstanceMigrationState
	for state == nil {
		if err := m.c.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return res, fmt.Errorf("get migration: %w", err)
		}
		switch mig.Status.Phase {
		case v1alpha1.MigrationSucceeded:
			state = mig.Status.MigrationState
			if state == nil {
				return res, errors.New("migration Succeeded with no migration state")
			}
			continue
		case v1alpha1.MigrationFailed:
			return res, fmt.Errorf("migration %s failed: %s", name, describeState(mig.Status.MigrationState))
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("migration %s: %s: %w", name, mig.Status.Phase, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for {
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := m.c.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err != nil {
			return res, fmt.Errorf("get VMI: %w", err)
		}
		if cur.Status.NodeName == state.TargetNode && cur.Status.LauncherPodName == state.TargetPod && cur.Status.Phase == v1alpha1.Running {
			res.EndToEnd = time.Since(created)
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("VMI %s not Running on %s: %w", name, state.TargetNode, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	note, err := m.migratedNote(ctx, vmi.UID, mig.UID)
	if err != nil {
		return res, err
	}
	res.Total, res.Downtime, res.Memory, res.Disks, res.Mode = note.Total, note.Downtime, note.MemoryBytes, note.DiskBytes, note.Mode
	res.Route = source + "→" + state.TargetNode
	// Beats after the migration: more than before it by beatsAfter.
	n := len(allBeats())
	if err := waitBeats(ctx, allBeats, n+beatsAfter); err != nil {
		return res, fmt.Errorf("VMI %s on %s: %w (%d beats through the API console)%s", name, state.TargetNode, err, len(api.beats()), m.diagnose(ctx, vmi, state, followers))
	}
	watchers := []*KernelWatcher{api.kernel}
	for _, f := range followers {
		watchers = append(watchers, f.kernel)
	}
	if err := watchKernel(ctx, watchers...); err != nil {
		return res, fmt.Errorf("VMI %s on %s: %w%s", name, state.TargetNode, err, m.diagnose(ctx, vmi, state, followers))
	}
	res.Gap, err = HeartbeatGap(rawBeats())
	return res, err
}

// diagnose says what the consoles of a VMI whose heartbeat did not come show.
func (m *migrator) diagnose(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, state *v1alpha1.VirtualMachineInstanceMigrationState, followers []*consoleFollower) string {
	var b strings.Builder
	for i, f := range followers {
		fmt.Fprintf(&b, "\n  console log %s", f.describe())
		// A copy for whoever looks into it: the VMI and its directories go with the round.
		if data, err := os.ReadFile(f.path); err == nil {
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("kvbench-migrate-%s-%s-%d.console.log", m.ns, vmi.Name, i))
			if os.WriteFile(keep, data, 0o600) == nil {
				fmt.Fprintf(&b, " (copied to %s)", keep)
			}
		}
	}
	cur := &v1alpha1.VirtualMachineInstance{}
	if err := m.c.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err == nil {
		fmt.Fprintf(&b, "\n  VMI: phase %s, node %s, pod %s, conditions %+v", cur.Status.Phase, cur.Status.NodeName, cur.Status.LauncherPodName, cur.Status.Conditions)
	}
	if m.cs != nil {
		raw, err := m.cs.CoreV1().Pods(m.ns).GetLogs(state.TargetPod, &corev1.PodLogOptions{Container: layout.ConsoleLogContainer, Timestamps: true}).DoRaw(ctx)
		out := string(raw)
		if len(out) > 1500 {
			out = out[len(out)-1500:]
		}
		fmt.Fprintf(&b, "\n  target pod %s %s log (%v): %q", state.TargetPod, layout.ConsoleLogContainer, err, out)
	}
	return b.String()
}

// distinctBeats is beats with one per uptime (the first to arrive), for counting.
func distinctBeats(bs []Beat) []Beat {
	seen := map[float64]bool{}
	var out []Beat
	for _, b := range bs {
		if !seen[b.Uptime] {
			seen[b.Uptime] = true
			out = append(out, b)
		}
	}
	return out
}

func describeState(s *v1alpha1.VirtualMachineInstanceMigrationState) string {
	if s == nil {
		return "no migration state"
	}
	return fmt.Sprintf("source %s/%s, target %s/%s: %s", s.SourceNode, s.SourcePod, s.TargetNode, s.TargetPod, s.FailureReason)
}

// migratedNote waits for the Migrated event of the VMI's migration and parses its note.
func (m *migrator) migratedNote(ctx context.Context, vmi, migration types.UID) (MigratedNote, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var evs eventsv1.EventList
		if err := m.c.List(ctx, &evs, client.InNamespace(m.ns)); err != nil {
			return MigratedNote{}, fmt.Errorf("list events: %w", err)
		}
		for _, ev := range evs.Items {
			if ev.Reason != v1alpha1.ReasonMigrated || ev.Regarding.UID != vmi {
				continue
			}
			n, err := ParseMigratedNote(ev.Note)
			if err != nil {
				return MigratedNote{}, err
			}
			if n.UID == string(migration) {
				return n, nil
			}
		}
		if time.Now().After(deadline) {
			return MigratedNote{}, fmt.Errorf("no Migrated event of migration %s in 30s", migration)
		}
		select {
		case <-ctx.Done():
			return MigratedNote{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// deleteVMI deletes the VMI and waits until it and its launcher pods are gone.
func (m *migrator) deleteVMI(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := m.c.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete VMI %s: %w", vmi.Name, err)
	}
	for {
		var pods corev1.PodList
		err := m.c.List(ctx, &pods, client.InNamespace(m.ns), client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)})
		gone := m.c.Get(ctx, client.ObjectKeyFromObject(vmi), &v1alpha1.VirtualMachineInstance{})
		if err == nil && len(pods.Items) == 0 && apierrors.IsNotFound(gone) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("VMI %s and its launcher pods did not go: %w", vmi.Name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
