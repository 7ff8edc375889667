package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/standalone"
)

// MemoryConfig is the configuration of `kubevisor-bench memory`, one field per flag.
type MemoryConfig struct {
	// GuestDir holds the test guest as `make guest` builds it; its disk image is the VMs'
	// containerDisk.
	GuestDir string
	// VMI is the manifest every VM is made from (the demo VMI): each gets its own name and UID,
	// the guest's disk, MemoryBytes of memory and GracePeriod.
	VMI string
	// BinDir holds kubevisor-launcher and the kubevisor-driver-<name> binaries, as for
	// `kubevisor-handler run`.
	BinDir string
	// VMs are the numbers of VMs of the rounds.
	VMs []int
	// MemoryBytes is each VM's guest memory.
	MemoryBytes uint64
	// BootTimeout bounds one VM's boot to Running and its console marker.
	BootTimeout time.Duration
	// GracePeriod is the VMs' terminationGracePeriodSeconds at the end of a round.
	GracePeriod time.Duration
	// Bridge and Subnet are the standalone pod network of the bench (not `kubevisor-handler
	// run`'s, so that both can run at once).
	Bridge, Subnet string
	// WorkDir holds the handler's state, run and sandbox directories; empty means a new
	// temporary directory under /tmp, removed at the end.
	WorkDir string
	// Acceleration is the handler's acceleration policy (auto, required, emulated).
	Acceleration string
	// LogLevel is the level of the handler's and the plugins' logs on stderr.
	LogLevel string
}

// Defaults of MemoryConfig.
const (
	DefaultMemoryVMFile      = "core/handler/testdata/demo-vmi.yaml"
	DefaultMemoryGuestBytes  = 128 << 20
	DefaultMemoryBootTimeout = 3 * time.Minute
	DefaultMemoryGrace       = 10 * time.Second
	DefaultMemoryBridge      = "kv-bench0"
	DefaultMemorySubnet      = "10.244.254.0/24"
)

// DefaultMemoryVMs are the VM counts of the memory rounds.
var DefaultMemoryVMs = []int{1, 5, 10}

// Aims of the memory bench (issue 5, "Measure").
const (
	// MemoryAim is the most Kubevisor may use per running VM beyond QEMU's own RSS.
	MemoryAim = 25 << 20
	// KubeVirtOverhead is the static memory overhead KubeVirt budgets per VMI.
	KubeVirtOverhead = 218 << 20
)

// procSnapshot is what the memory bench reads of one process.
type procSnapshot struct {
	pid, ppid int
	comm      string
}

// memoryRound is what one round read, each figure the median of rssSamples readings.
type memoryRound struct {
	vms       int
	qemu      []MemUsage // per VM
	launchers []MemUsage // per VM: the launcher and whatever else runs under it but QEMU
	handler   MemUsage   // the bench process, which runs the Handler
	drivers   map[string]MemUsage
}

// accounting picks one way of counting memory out of a MemUsage.
type accounting struct {
	name string
	of   func(MemUsage) uint64
}

// The accountings the memory bench reports: RSS counts a binary's text in every process that
// runs it, PSS shares it among them (the memory the processes take together), anonymous
// memory leaves out file-backed pages altogether.
var (
	byRSS = accounting{"RSS", func(m MemUsage) uint64 { return m.RSS }}
	byPSS = accounting{"PSS", func(m MemUsage) uint64 { return m.PSS }}
	// byAnon counts only anonymous memory (heap, stacks): what a process holds that the kernel
	// cannot drop and read back from its binary, unlike the clean text pages RSS and PSS count.
	byAnon = accounting{"anonymous memory", func(m MemUsage) uint64 { return m.Anon }}
)

// memoryFigures are a round's figures per running VM, in bytes.
type memoryFigures struct {
	qemu, launcher, handler, drivers float64
}

// overhead is Kubevisor's memory per VM beyond QEMU.
func (f memoryFigures) overhead() float64 { return f.launcher + f.handler + f.drivers }

// figures divides a round's readings, counted by acc, by its VM count. handlerBase is the bench
// process's memory before the Handler was made: the handler's is the process's beyond it.
func (r memoryRound) figures(acc accounting, handlerBase MemUsage) memoryFigures {
	n := float64(r.vms)
	var drivers uint64
	for _, d := range r.drivers {
		drivers += acc.of(d)
	}
	return memoryFigures{
		qemu:     float64(sum(acc, r.qemu)) / n,
		launcher: float64(sum(acc, r.launchers)) / n,
		handler:  max(float64(acc.of(r.handler))-float64(acc.of(handlerBase)), 0) / n,
		drivers:  float64(drivers) / n,
	}
}

// marginal is Kubevisor's memory beyond QEMU per VM that round b runs more than round a.
func marginal(acc accounting, a, b memoryRound, handlerBase MemUsage) float64 {
	total := func(r memoryRound) float64 { return r.figures(acc, handlerBase).overhead() * float64(r.vms) }
	return (total(b) - total(a)) / float64(b.vms-a.vms)
}

func sum(acc accounting, xs []MemUsage) uint64 {
	var t uint64
	for _, x := range xs {
		t += acc.of(x)
	}
	return t
}

// verdict says whether per-VM overhead meets the aim.
func verdict(overhead float64) string {
	if overhead <= MemoryAim {
		return "met"
	}
	return "NOT met"
}

// descendants returns the pids of root's descendants in procs (not root itself), in pid order.
func descendants(procs []procSnapshot, root int) []int {
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var out []int
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	slices.Sort(out)
	return out
}

// isQEMU tells a QEMU process by its command name (qemu-system-x86_64 is cut to 15 bytes).
func isQEMU(comm string) bool { return strings.HasPrefix(comm, "qemu-system") }

// ParseProcStat returns the command name and parent pid from the text of /proc/PID/stat. The
// name is in parentheses and may hold spaces and parentheses itself.
func ParseProcStat(stat []byte) (comm string, ppid int, err error) {
	s := string(stat)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, errors.New("stat: no command name in parentheses")
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 2 {
		return "", 0, errors.New("stat: too few fields")
	}
	if _, err := fmt.Sscan(fields[1], &ppid); err != nil {
		return "", 0, fmt.Errorf("stat: parent pid %q: %w", fields[1], err)
	}
	return s[open+1 : end], ppid, nil
}

// processes reads every process's pid, parent and name from /proc; those that vanish while it
// reads are left out.
func processes() ([]procSnapshot, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []procSnapshot
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || !e.IsDir() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		comm, ppid, err := ParseProcStat(raw)
		if err != nil {
			continue
		}
		out = append(out, procSnapshot{pid: pid, ppid: ppid, comm: comm})
	}
	return out, nil
}

// BenchVMI is the VMI of VM i of the bench, made from template: its own name and UID, the guest
// disk image disk as its containerDisk, memory bytes of guest memory and grace as its
// termination grace period. template is not changed.
func BenchVMI(template *v1alpha1.VirtualMachineInstance, i int, uid types.UID, disk string, memory uint64, grace time.Duration) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := template.DeepCopy()
	vmi.Name = fmt.Sprintf("bench-%d", i)
	vmi.UID = uid
	q := resource.NewQuantity(int64(memory), resource.BinarySI)
	vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: q}
	secs := int64(grace / time.Second)
	vmi.Spec.TerminationGracePeriodSeconds = &secs
	found := 0
	for j, v := range vmi.Spec.Volumes {
		if v.ContainerDisk != nil {
			vmi.Spec.Volumes[j].ContainerDisk.Image = disk
			found++
		}
	}
	if found != 1 {
		return nil, fmt.Errorf("the VMI has %d containerDisk volumes, want 1 (the guest's disk)", found)
	}
	return vmi, nil
}

// memoryBench runs the rounds of one `kubevisor-bench memory`.
type memoryBench struct {
	cfg      MemoryConfig
	out      io.Writer
	log      hclog.Logger
	hcfg     handler.Config
	h        *handler.Handler
	guest    conformance.Guest
	template *v1alpha1.VirtualMachineInstance

	mu        sync.Mutex
	sandboxes map[types.UID]*standalone.Sandbox
}

// memoryVM is one running VM of a round.
type memoryVM struct {
	vmi *v1alpha1.VirtualMachineInstance
	sb  *standalone.Sandbox
}

// RunMemory runs the memory benchmark and writes its figures to out; logs go to logOut.
func RunMemory(ctx context.Context, cfg MemoryConfig, out, logOut io.Writer) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, as kubevisor-handler run)")
	}
	g, err := conformance.GuestFromDir(cfg.GuestDir)
	if err != nil {
		return fmt.Errorf("test guest: %w", err)
	}
	if g.Disk == "" {
		return fmt.Errorf("test guest: %s must hold %s (make guest)", cfg.GuestDir, conformance.GuestDiskFile)
	}
	if g.Disk, err = filepath.Abs(g.Disk); err != nil {
		return err
	}
	template, err := standalone.LoadVMI(cfg.VMI)
	if err != nil {
		return err
	}
	binDir, err := filepath.Abs(cfg.BinDir)
	if err != nil {
		return err
	}
	work := cfg.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("/tmp", "kvmem-"); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		defer os.RemoveAll(work)
	} else if work, err = filepath.Abs(work); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	hcfg, ms, err := standalone.Prepare(handler.Config{
		StateDir:     filepath.Join(work, "state"),
		Acceleration: cfg.Acceleration,
		RunDir:       filepath.Join(work, "run"),
		Standalone: &handler.StandaloneConfig{
			SandboxDir: filepath.Join(work, "sb"), Bridge: cfg.Bridge, Subnet: cfg.Subnet,
		},
	}, binDir)
	if err != nil {
		return err
	}
	defer removeBridge(cfg.Bridge, out)

	b := &memoryBench{
		cfg: cfg, out: out, guest: g, template: template, hcfg: hcfg,
		log:       hclog.New(&hclog.LoggerOptions{Name: "kubevisor-bench", Level: hclog.LevelFromString(cfg.LogLevel), Output: logOut}),
		sandboxes: map[types.UID]*standalone.Sandbox{},
	}
	// The bench process before the Handler: what it holds without one.
	base, err := medianMem(ctx, os.Getpid())
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	b.h, err = handler.New(sctx, hcfg, handler.Options{
		Logger:    b.log,
		Manifests: ms,
		Sandboxes: handler.SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) handler.Sandbox {
			b.mu.Lock()
			defer b.mu.Unlock()
			if sb := b.sandboxes[vmi.UID]; sb != nil {
				return sb
			}
			return nil
		}),
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := b.h.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close the handler: %w", cerr)
		}
	}()
	for _, d := range b.h.Drivers() {
		if !d.Loaded {
			return fmt.Errorf("%s driver %s: %s", d.Kind, d.Name, d.Error)
		}
	}
	idle, err := medianMem(ctx, os.Getpid())
	if err != nil {
		return err
	}
	b.header(base, idle)

	var rounds []memoryRound
	for _, n := range cfg.VMs {
		r, err := b.round(ctx, n)
		if err != nil {
			return err
		}
		rounds = append(rounds, r)
	}
	for _, d := range b.h.Drivers() {
		if d.Plugin.Restarts > 0 {
			fmt.Fprintf(out, "\nwarning: the %s driver's plugin process was restarted %d times during the bench (last error: %s)\n", d.Name, d.Plugin.Restarts, d.Plugin.LastError)
		}
	}
	b.report(rounds, base)
	return nil
}

// header prints what runs and the handler's idle figures.
func (b *memoryBench) header(base, idle MemUsage) {
	fmt.Fprintf(b.out, "kubevisor-bench memory: resident memory per running VM (from /proc/PID/smaps_rollup: RSS, PSS and anonymous; median of %d readings %s apart, read %s after the last VM reached %s)\n",
		rssSamples, rssInterval, rssSettle, b.guest.ReadyMarker)
	fmt.Fprintf(b.out, "  VMs:      %s as the template, %d MiB guest memory each, containerDisk %s, booted one after another\n",
		b.cfg.VMI, b.cfg.MemoryBytes>>20, b.guest.Disk)
	fmt.Fprintf(b.out, "  sandbox:  per VM a network namespace on bridge %s (%s) and a kubevisor-launcher in it, as kubevisor-handler run makes them\n",
		b.cfg.Bridge, b.cfg.Subnet)
	fmt.Fprintf(b.out, "  handler:  one handler.Handler inside this process (pid %d): kubevisor-handler has no mode for several VMIs; its memory is this process's\n", os.Getpid())
	fmt.Fprintf(b.out, "            beyond what it held before the Handler was made (RSS %s, PSS %s; with the drivers loaded and no VM: RSS %s, PSS %s)\n",
		mib(float64(base.RSS)), mib(float64(base.PSS)), mib(float64(idle.RSS)), mib(float64(idle.PSS)))
	for _, d := range b.h.Drivers() {
		fmt.Fprintf(b.out, "  driver:   %-10s %-5s plugin pid %d\n", d.Kind, d.Name, d.Plugin.Pid)
	}
	fmt.Fprintf(b.out, "  host:     %d CPUs, load average %s\n", runtime.NumCPU(), loadAvg())
}

// round boots n VMs, reads the RSS of every process, and removes them.
func (b *memoryBench) round(ctx context.Context, n int) (memoryRound, error) {
	fmt.Fprintf(b.out, "\nround of %d VM(s):\n", n)
	var vms []memoryVM
	stopped := false
	defer func() {
		if !stopped {
			if err := b.stopAll(vms); err != nil {
				fmt.Fprintf(b.out, "warning: clean up: %v\n", err)
			}
		}
	}()
	start := time.Now()
	for i := range n {
		vm, err := b.boot(ctx, i)
		if vm.sb != nil {
			vms = append(vms, vm)
		}
		if err != nil {
			return memoryRound{}, fmt.Errorf("VM %d of %d: %w", i+1, n, err)
		}
	}
	fmt.Fprintf(b.out, "  %d VM(s) Running with %s on the console (%s)\n", n, b.guest.ReadyMarker, secs(time.Since(start)))
	select {
	case <-time.After(rssSettle):
	case <-ctx.Done():
		return memoryRound{}, ctx.Err()
	}
	r, err := b.read(ctx, vms)
	if err != nil {
		return memoryRound{}, err
	}
	stopped = true
	if err := b.stopAll(vms); err != nil {
		return memoryRound{}, err
	}
	return r, nil
}

// boot makes VM i's sandbox, syncs its VMI and waits for Running and the console marker.
func (b *memoryBench) boot(ctx context.Context, i int) (memoryVM, error) {
	vmi, err := BenchVMI(b.template, i, newUID(), b.guest.Disk, b.cfg.MemoryBytes, b.cfg.GracePeriod)
	if err != nil {
		return memoryVM{}, err
	}
	sb, err := standalone.NewSandbox(ctx, b.log.Named("sandbox"), b.hcfg, vmi, b.cfg.GracePeriod)
	if err != nil {
		return memoryVM{}, fmt.Errorf("sandbox: %w", err)
	}
	vm := memoryVM{vmi: vmi, sb: sb}
	b.mu.Lock()
	b.sandboxes[vmi.UID] = sb
	b.mu.Unlock()

	bctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	if _, err := b.h.Sync(bctx, vmi); err != nil {
		return vm, fmt.Errorf("sync: %w", err)
	}
	w := NewMarkerWatcher(b.guest.ReadyMarker)
	consoleCtx, closeConsole := context.WithCancel(bctx)
	defer closeConsole()
	consoleDone := make(chan error, 1)
	go func() { consoleDone <- b.h.Console(consoleCtx, vmi.UID, nil, w) }()
	running := false
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st, _ := b.h.Status(vmi.UID)
		switch st.Phase {
		case v1alpha1.Running:
			running = true
		case v1alpha1.Failed, v1alpha1.Succeeded:
			return vm, fmt.Errorf("VMI %s ended %s (%s); console: %q", vmi.Name, st.Phase, st.Reason, w.Tail())
		}
		if running && isClosed(w.Found()) {
			return vm, nil
		}
		select {
		case <-tick.C:
		case err := <-consoleDone:
			if !isClosed(w.Found()) {
				return vm, fmt.Errorf("console ended (%v) before %s; phase %s; console: %q", err, b.guest.ReadyMarker, st.Phase, w.Tail())
			}
			consoleDone = nil
		case <-sb.Exited():
			return vm, fmt.Errorf("the launcher exited; phase %s; console: %q", st.Phase, w.Tail())
		case <-bctx.Done():
			return vm, fmt.Errorf("phase %s, marker seen %t: %w; console: %q", st.Phase, isClosed(w.Found()), bctx.Err(), w.Tail())
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// read reads the RSS of the VMs' QEMUs and launchers, the handler (this process) and the driver
// plugins. What else runs under a launcher or a driver (not QEMU) counts as theirs.
func (b *memoryBench) read(ctx context.Context, vms []memoryVM) (memoryRound, error) {
	procs, err := processes()
	if err != nil {
		return memoryRound{}, err
	}
	comm := map[int]string{}
	for _, p := range procs {
		comm[p.pid] = p.comm
	}
	r := memoryRound{vms: len(vms), drivers: map[string]MemUsage{}}
	for _, vm := range vms {
		lpid := vm.sb.LauncherPid()
		var qemu []int
		launcher := []int{lpid}
		for _, pid := range descendants(procs, lpid) {
			if isQEMU(comm[pid]) {
				qemu = append(qemu, pid)
			} else {
				launcher = append(launcher, pid)
			}
		}
		if len(qemu) != 1 {
			return memoryRound{}, fmt.Errorf("VMI %s: %d QEMU processes under its launcher (pid %d), want 1", vm.vmi.Name, len(qemu), lpid)
		}
		q, err := medianMem(ctx, qemu[0])
		if err != nil {
			return memoryRound{}, fmt.Errorf("QEMU of %s: %w", vm.vmi.Name, err)
		}
		l, err := treeMem(ctx, launcher)
		if err != nil {
			return memoryRound{}, fmt.Errorf("launcher of %s: %w", vm.vmi.Name, err)
		}
		r.qemu, r.launchers = append(r.qemu, q), append(r.launchers, l)
	}
	if r.handler, err = medianMem(ctx, os.Getpid()); err != nil {
		return memoryRound{}, fmt.Errorf("handler: %w", err)
	}
	for _, d := range b.h.Drivers() {
		if d.Plugin.Pid <= 0 {
			return memoryRound{}, fmt.Errorf("the %s driver's plugin process is not running", d.Name)
		}
		pids := []int{d.Plugin.Pid}
		for _, pid := range descendants(procs, d.Plugin.Pid) {
			if isQEMU(comm[pid]) {
				return memoryRound{}, fmt.Errorf("a QEMU (pid %d) runs under the %s driver, not under a launcher", pid, d.Name)
			}
			pids = append(pids, pid)
		}
		if r.drivers[d.Name], err = treeMem(ctx, pids); err != nil {
			return memoryRound{}, fmt.Errorf("%s driver: %w", d.Name, err)
		}
	}
	tab := table{w: b.out, widths: []int{24, 10, 10, 10}}
	tab.row("", "RSS", "PSS", "anonymous")
	row := func(name string, m MemUsage) {
		tab.row(name, mib(float64(m.RSS)), mib(float64(m.PSS)), mib(float64(m.Anon)))
	}
	for _, d := range slices.Sorted(maps.Keys(r.drivers)) {
		row("  driver "+d, r.drivers[d])
	}
	row("  handler (this process)", r.handler)
	var launchers, qemus MemUsage
	for i := range r.launchers {
		launchers, qemus = launchers.Add(r.launchers[i]), qemus.Add(r.qemu[i])
	}
	row("  launchers (sum)", launchers)
	row("  QEMUs (sum)", qemus)
	return r, nil
}

// treeMem is the sum of the median memory of pids. A process that exited meanwhile (a
// short-lived helper) counts as nothing.
func treeMem(ctx context.Context, pids []int) (MemUsage, error) {
	var total MemUsage
	for i, pid := range pids {
		m, err := medianMem(ctx, pid)
		if err != nil {
			if i > 0 {
				continue
			}
			return MemUsage{}, err
		}
		total = total.Add(m)
	}
	return total, nil
}

// stopAll stops the VMIs through the handler and tears their sandboxes down, then checks that
// nothing is left: no VMI in the handler, no network namespace.
func (b *memoryBench) stopAll(vms []memoryVM) error {
	if len(vms) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.GracePeriod+cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(vms))
	for i, vm := range vms {
		wg.Go(func() {
			if _, err := b.h.Stop(ctx, vm.vmi, b.cfg.GracePeriod); err != nil {
				errs[i] = fmt.Errorf("stop %s: %w", vm.vmi.Name, err)
			}
			_ = vm.sb.Close(ctx) // closed by Stop unless it failed
			b.mu.Lock()
			delete(b.sandboxes, vm.vmi.UID)
			b.mu.Unlock()
		})
	}
	wg.Wait()
	for _, vm := range vms {
		if _, err := os.Stat("/run/netns/" + vm.sb.NetNS()); err == nil {
			errs = append(errs, fmt.Errorf("network namespace %s is left", vm.sb.NetNS()))
		}
	}
	if left := b.h.VMIs(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("the handler still has %d VMIs", len(left)))
	}
	return errors.Join(errs...)
}

// report prints the table of the rounds and the verdict.
func (b *memoryBench) report(rounds []memoryRound, handlerBase MemUsage) {
	worst := map[string]float64{}
	lastGrowth := map[string]float64{} // by accounting: the growth between the last two rounds
	for _, acc := range []accounting{byRSS, byPSS, byAnon} {
		fmt.Fprintf(b.out, "\nper running VM, by %s (handler share: its %s beyond the bench process's before the Handler / N; drivers' share: the %d driver processes' %s / N)\n",
			acc.name, acc.name, len(b.h.Drivers()), acc.name)
		tab := table{w: b.out, widths: []int{4, 10, 10, 13, 14, 18, 24, 19}}
		tab.row("VMs", "QEMU", "launcher", "handler share", "drivers' share", "Kubevisor overhead", "aim ≤ 25 MiB beyond QEMU", "growth per added VM")
		for i, r := range rounds {
			f := r.figures(acc, handlerBase)
			worst[acc.name] = max(worst[acc.name], f.overhead())
			growth := "-"
			if i > 0 {
				lastGrowth[acc.name] = marginal(acc, rounds[i-1], r, handlerBase)
				growth = fmt.Sprintf("%s (%d→%d)", mib(lastGrowth[acc.name]), rounds[i-1].vms, r.vms)
			}
			tab.row(fmt.Sprint(r.vms), mib(f.qemu), mib(f.launcher), mib(f.handler), mib(f.drivers), mib(f.overhead()), verdict(f.overhead()), growth)
		}
	}
	fmt.Fprintln(b.out, "(growth per added VM: Kubevisor's total beyond QEMU, launchers + handler + drivers, between two rounds, per VM more)")
	fmt.Fprintln(b.out, "(RSS counts the launcher binary's text once per launcher; PSS splits pages shared by processes among them, so summed it is what they take together;")
	fmt.Fprintln(b.out, " anonymous memory leaves out the binaries' clean text pages, which the kernel can drop and read back: most of a Go plugin's RSS)")
	accel := "unknown"
	for k, v := range b.h.NodeLabels() {
		if strings.HasSuffix(k, ".accel") {
			accel = v
		}
	}
	fmt.Fprintf(b.out, "\nload average at the end: %s; accelerator of the VMs (hypervisor driver's fingerprint): %s\n", loadAvg(), accel)
	for _, acc := range []accounting{byRSS, byPSS, byAnon} {
		fmt.Fprintf(b.out, "Kubevisor overhead per VM beyond QEMU by %s: at most %s over %d round(s) (aim ≤ %s: %s; KubeVirt budgets %s of static overhead per VMI)\n",
			acc.name, mib(worst[acc.name]), len(rounds), mib(MemoryAim), verdict(worst[acc.name]), mib(KubeVirtOverhead))
	}
	if len(rounds) > 1 {
		fmt.Fprintf(b.out, "each added VM costs %s by PSS beyond QEMU (aim ≤ %s: %s); the rest is the node's fixed cost of the handler and driver processes, shared by all its VMs\n",
			mib(lastGrowth[byPSS.name]), mib(MemoryAim), verdict(lastGrowth[byPSS.name]))
	}
}

// removeBridge deletes the bench's pod network bridge, which the CNI bridge plugin leaves.
func removeBridge(name string, out io.Writer) {
	if _, err := os.Stat("/sys/class/net/" + name); err != nil {
		return
	}
	if o, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
		fmt.Fprintf(out, "warning: remove bridge %s: %v: %s\n", name, err, strings.TrimSpace(string(o)))
	}
}

// newUID returns a random (version 4) UUID.
func newUID() types.UID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}
