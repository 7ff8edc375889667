package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
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

const startUsage = `usage: kubevisor-bench start [flags]

Runs on the node of a one-node cluster where Kubevisor is installed (make up), as root. Each
run boots the test guest twice, in alternating order: once with raw qemu-system-x86_64 (the
command line the qmp driver builds for the guest's disk booted by the BIOS, with a NoCloud seed
CD-ROM and a user-mode NIC, as the cluster VM has) from exec to the console marker; and once as
a VMI (conformance/e2e's guest: containerDisk, cloud-init, masquerade) from the create request
to phase Running and to the marker in the node's console log. For the VMI it prints the
timeline the bench saw on its watches (pod created, scheduled, each container started, pod
Running, VMI Running, the console's first byte and marker) with the node handler's sync steps
from the VMI's Started event; then the medians of every phase and the ratio of the VMI's
create-to-marker to raw QEMU's exec-to-marker, against the aim of 1.25.

Flags:
`

// Defaults of `kubevisor-bench start`.
const (
	DefaultStartRuns    = 5
	DefaultStartTimeout = 3 * time.Minute
	// StartAim is issue 14's aim for VMI creation → marker over raw QEMU's start → marker.
	StartAim = 1.25
	// consoleFilePoll is how often the bench reads the VMI's console log for its first byte
	// and marker.
	consoleFilePoll = 10 * time.Millisecond
)

// StartConfig is the configuration of `kubevisor-bench start`, one field per flag.
type StartConfig struct {
	Kubeconfig  string
	Image       string
	GuestDir    string
	QEMU        string
	QemuImg     string
	HostState   string
	Runs        int
	Warmup      int
	MemoryBytes uint64
	Timeout     time.Duration
}

func runStart(args []string, stdout, stderr io.Writer) int {
	cfg := StartConfig{MemoryBytes: 128 << 20}
	fs := flag.NewFlagSet("kubevisor-bench start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, startUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin `kubeconfig` of the cluster")
	fs.StringVar(&cfg.Image, "image", DefaultE2EImage, "containerDisk `image` of the test guest")
	fs.StringVar(&cfg.GuestDir, "guest", "_output/guest", "`directory` of the test guest (make guest), for the raw runs")
	fs.StringVar(&cfg.QEMU, "qemu", "qemu-system-x86_64", "QEMU `binary` of the raw runs")
	fs.StringVar(&cfg.QemuImg, "qemu-img", "qemu-img", "qemu-img `binary` for the raw runs' overlays")
	fs.StringVar(&cfg.HostState, "host-state", DefaultE2EHostState, "the node's Kubevisor state `directory`")
	fs.IntVar(&cfg.Runs, "runs", DefaultStartRuns, "measured `pairs` of a raw and a VMI boot")
	fs.IntVar(&cfg.Warmup, "warmup", 1, "warm-up `pairs`, not counted")
	fs.Var((*bytesFlag)(&cfg.MemoryBytes), "memory", "guest memory, a `quantity`")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultStartTimeout, "how long one boot may take to its marker")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	switch {
	case len(fs.Args()) > 0:
		fmt.Fprintf(stderr, "kubevisor-bench start: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	case cfg.Runs < 1 || cfg.Warmup < 0 || cfg.Timeout <= 0:
		fmt.Fprintln(stderr, "kubevisor-bench start: --runs must be at least 1, --warmup not negative, --timeout positive")
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunStart(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench start: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

// starter runs one `kubevisor-bench start`.
type starter struct {
	cfg   StartConfig
	out   io.Writer
	c     client.WithWatch
	ns    string
	guest conformance.Guest
	qemu  string
	accel qmp.Accel
	work  string
}

// RunStart runs the start benchmark and prints its figures to out.
func RunStart(ctx context.Context, cfg StartConfig, out io.Writer) error {
	if _, err := os.Stat(layout.VMIsDir(cfg.HostState)); err != nil {
		return fmt.Errorf("the node's %s/vmi is needed for the console log (run on the node, as root): %w", cfg.HostState, err)
	}
	g, err := conformance.GuestFromDir(cfg.GuestDir)
	if err != nil {
		return fmt.Errorf("test guest: %w", err)
	}
	if g.Disk == "" {
		return fmt.Errorf("test guest: %s has no %s (make guest)", cfg.GuestDir, conformance.GuestDiskFile)
	}
	s := &starter{cfg: cfg, out: out, guest: g}
	if s.qemu, err = exec.LookPath(cfg.QEMU); err != nil {
		return fmt.Errorf("qemu: %w (install qemu-system-x86)", err)
	}
	if _, err := exec.LookPath("genisoimage"); err != nil {
		return fmt.Errorf("genisoimage makes the raw runs' seed: %w (install genisoimage)", err)
	}
	host := qmp.NewProber().Probe(ctx, qmp.ProbeOptions{QEMU: s.qemu})
	s.accel = host.Best()
	if s.work, err = os.MkdirTemp("/tmp", "kvbench-start-"); err != nil {
		return err
	}
	defer os.RemoveAll(s.work)

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if s.c, err = client.NewWithWatch(rc, client.Options{Scheme: manager.Scheme()}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-bench-start-", Labels: map[string]string{"kubevisor.io/bench": "start"}}}
	if err := s.c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	s.ns = ns.Name
	defer func() {
		_ = s.c.Delete(context.Background(), ns)
	}()

	fmt.Fprintf(out, "kubevisor-bench start: test guest %s (%d MiB) in namespace %s; raw QEMU with accel %s; load average %s\n",
		cfg.Image, cfg.MemoryBytes>>20, s.ns, s.accel, loadAvg())
	fmt.Fprintf(out, "  %d warm-up pair(s), then %d pairs of a raw and a VMI boot in alternating order\n\n", cfg.Warmup, cfg.Runs)
	tab := table{w: out, widths: []int{7, 5, 11, 12, 12, 10}}
	tab.row("", "", "raw", "VMI", "VMI", "")
	tab.row("run", "first", "exec→marker", "→Running", "→marker", "VMI/raw")
	var raws []time.Duration
	var runs []*vmiTimeline
	for i := range cfg.Warmup + cfg.Runs {
		var raw time.Duration
		var run *vmiTimeline
		rawBoot := func() (err error) { raw, err = s.rawBoot(ctx, i); return err }
		vmiBoot := func() (err error) { run, err = s.vmiBoot(ctx, i); return err }
		first, order := "raw", []func() error{rawBoot, vmiBoot}
		if i%2 == 1 {
			first, order = "VMI", []func() error{vmiBoot, rawBoot}
		}
		for _, f := range order {
			if err := f(); err != nil {
				return err
			}
		}
		label := fmt.Sprintf("warm-%d", i+1)
		if i >= cfg.Warmup {
			label = fmt.Sprintf("%d", i-cfg.Warmup+1)
			raws, runs = append(raws, raw), append(runs, run)
		}
		running, _ := run.get(phaseVMIRunning)
		marker, _ := run.get(phaseMarker)
		tab.row(label, first, secs(raw), secs(running), secs(marker), ratio(marker, raw))
	}
	s.summary(raws, runs)
	return nil
}

// summary prints the median timeline of the runs and the verdict.
func (s *starter) summary(raws []time.Duration, runs []*vmiTimeline) {
	fmt.Fprintf(s.out, "\ntimeline of a VMI start (%d runs, seconds after the create request; the handler's steps end at the offsets shown):\n", len(runs))
	printPhases(s.out, runs)
	rm := Median(raws)
	var markers, running []time.Duration
	for _, r := range runs {
		if d, ok := r.get(phaseMarker); ok {
			markers = append(markers, d)
		}
		if d, ok := r.get(phaseVMIRunning); ok {
			running = append(running, d)
		}
	}
	mm := Median(markers)
	fmt.Fprintf(s.out, "\nraw QEMU exec → marker: median %s; VMI create → Running: median %s; create → marker: median %s\n", secs(rm), secs(Median(running)), secs(mm))
	verdict := "meets"
	if mm.Seconds() > StartAim*rm.Seconds() {
		verdict = "misses"
	}
	fmt.Fprintf(s.out, "VMI/raw to the marker: %s (%s the aim of %.2f)\n", ratio(mm, rm), verdict, StartAim)
}

// rawBoot boots the guest's disk with raw QEMU: exec to the marker.
func (s *starter) rawBoot(ctx context.Context, i int) (time.Duration, error) {
	runDir := filepath.Join(s.work, fmt.Sprintf("raw%d", i))
	if err := os.MkdirAll(filepath.Join(runDir, "seed"), 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(runDir)
	overlay := filepath.Join(runDir, overlayFile)
	if out, err := exec.CommandContext(ctx, s.cfg.QemuImg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", s.guest.Disk, overlay).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("create overlay: %w: %s", err, strings.TrimSpace(string(out)))
	}
	seedDir, iso := filepath.Join(runDir, "seed"), filepath.Join(runDir, "seed.iso")
	for name, text := range map[string]string{
		"user-data": "#cloud-config\n# kubevisor-bench start, raw run\n",
		"meta-data": fmt.Sprintf("instance-id: raw-%d\nlocal-hostname: raw\n", i),
	} {
		if err := os.WriteFile(filepath.Join(seedDir, name), []byte(text), 0o600); err != nil {
			return 0, err
		}
	}
	if out, err := exec.CommandContext(ctx, "genisoimage", "-quiet", "-V", "cidata", "-J", "-r", "-o", iso, seedDir).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("seed ISO: %w: %s", err, strings.TrimSpace(string(out)))
	}
	spec := &domainv1.DomainSpec{
		Id: fmt.Sprintf("raw-%d", i), Name: "kubevisor-bench/raw",
		Memory:   &domainv1.Memory{GuestBytes: s.cfg.MemoryBytes},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}},
		Disks: []*domainv1.Disk{
			{Name: "containerdisk", Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, BootOrder: 1},
			{Name: "cloudinitdisk", Path: iso, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
		},
		Serial: &domainv1.Serial{SocketPath: filepath.Join(runDir, serialSocket)},
		RunDir: runDir,
	}
	cl, err := qmp.BuildArgs(spec, qmp.HostEnv{Accel: s.accel, RunDir: runDir})
	if err != nil {
		return 0, fmt.Errorf("build the raw command line: %w", err)
	}
	args, err := RawArgs(cl.Args)
	if err != nil {
		return 0, err
	}
	args = append(args, "-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0")
	b := &bencher{cfg: BootConfig{QemuImg: s.cfg.QemuImg, BootTimeout: s.cfg.Timeout}, guest: s.guest, qemu: s.qemu}
	return b.runQEMU(ctx, runDir, args)
}

// vmiBoot creates the VMI, follows it to its console marker, then deletes it and waits for its
// launcher pod to go.
func (s *starter) vmiBoot(ctx context.Context, i int) (*vmiTimeline, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	mem := resource.NewQuantity(int64(s.cfg.MemoryBytes), resource.BinarySI)
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("start-%d", i), Namespace: s.ns},
		Spec:       guest.Spec(guest.Options{Image: s.cfg.Image, Memory: mem, UserData: fmt.Sprintf("kubevisor-bench start %d", i)}),
	}
	run := newTimeline(vmi.Name)

	// The watches start before the create, so that nothing is missed.
	type watched struct {
		what string
		list client.ObjectList
	}
	var ws []watch.Interface
	defer func() {
		for _, w := range ws {
			w.Stop()
		}
	}()
	for _, wl := range []watched{{"VMIs", &v1alpha1.VirtualMachineInstanceList{}}, {"pods", &corev1.PodList{}}, {"events", &eventsv1.EventList{}}} {
		w, err := s.c.Watch(ctx, wl.list, client.InNamespace(s.ns))
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", wl.what, err)
		}
		ws = append(ws, w)
		go followTimelines(w, func(name string) *vmiTimeline {
			if name == run.vmi {
				return run
			}
			return nil
		})
	}

	run.setSent(time.Now())
	if err := s.c.Create(ctx, vmi); err != nil {
		return nil, fmt.Errorf("create VMI: %w", err)
	}
	run.mark(phaseVMICreated, time.Now())

	consoleLog := layout.ConsoleLog(s.cfg.HostState, vmi.UID)
	marker := []byte(s.guest.ReadyMarker)
	for {
		if b, err := os.ReadFile(consoleLog); err == nil && len(b) > 0 {
			now := time.Now()
			run.mark(phaseFirstByte, now)
			if strings.Contains(string(b), string(marker)) {
				run.mark(phaseMarker, now)
				break
			}
		}
		run.mu.Lock()
		failed := run.failed
		run.mu.Unlock()
		if failed != "" {
			return nil, fmt.Errorf("VMI %s: %s", vmi.Name, failed)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("VMI %s: no console marker in %s: %w (seen: %v)", vmi.Name, consoleLog, ctx.Err(), run.order)
		case <-time.After(consoleFilePoll):
		}
	}
	// The Started event may come a moment after the marker (not in practice: the VM starts
	// after it is sent, and boots for seconds).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := run.get(phaseStartedNote); ok {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return run, s.deleteVMI(context.WithoutCancel(ctx), vmi)
}

// deleteVMI deletes the VMI and waits until it and its launcher pod are gone.
func (s *starter) deleteVMI(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := s.c.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete VMI %s: %w", vmi.Name, err)
	}
	for {
		var pods corev1.PodList
		err := s.c.List(ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)})
		gone := s.c.Get(ctx, client.ObjectKeyFromObject(vmi), &v1alpha1.VirtualMachineInstance{})
		if err == nil && len(pods.Items) == 0 && apierrors.IsNotFound(gone) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("VMI %s and its launcher pod did not go: %w", vmi.Name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
