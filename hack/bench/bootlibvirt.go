package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// The libvirt driver's name on the bench's plugin host (libvirt.Name) and its default VM user
// (lvUser): not imported, since drivers/libvirt links libvirt's C library (cgo),
// which the bench's other commands need not.
const (
	lvDriverName = "libvirt"
	lvUser       = "nobody"
)

// Timeouts of the libvirt arm's launchers.
const (
	launcherReady = 15 * time.Second
	launcherExit  = 10 * time.Second
)

// lvArm is the libvirt driver's arm of the boot bench.
type lvArm struct {
	hv       driver.Hypervisor
	con      driver.Consoler
	launcher string // the kubevisor-launcher binary
	// cmdline is the command line libvirtd ran QEMU with in the first boot, for the report.
	cmdline []string
}

// startLibvirt starts the libvirt driver plugin on the bench's plugin host and waits for its
// accelerator probe, as startDriver does for qmp.
func (b *bencher) startLibvirt(ctx context.Context) error {
	l, err := conformance.FindLauncher(b.cfg.Launcher)
	if err != nil {
		return fmt.Errorf("the libvirt arm starts a launcher per VM: %w", err)
	}
	m, err := plugin.ManifestFor(b.cfg.Libvirt, driver.KindHypervisor, lvDriverName)
	if err != nil {
		return err
	}
	if err := b.host.Start(ctx, m); err != nil {
		return err
	}
	hv, err := b.host.Hypervisor(lvDriverName)
	if err != nil {
		return err
	}
	caps, err := hv.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("libvirt capabilities: %w", err)
	}
	if !driver.HasFeature(caps, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE) || !slices.Contains(caps.GetFirmware(), "kernel") {
		return fmt.Errorf("driver %s declares no console or no kernel boot", b.cfg.Libvirt)
	}
	con, ok := driver.Optional[driver.Consoler](ctx, hv)
	if !ok {
		return fmt.Errorf("the client of driver %s has no Console", lvDriverName)
	}
	fp, err := firstFingerprint(ctx, hv)
	if err != nil {
		return err
	}
	if a := fp.GetAttributes()["accel"]; a != string(b.accel) {
		return fmt.Errorf("the libvirt driver runs VMs with accel %q, the qmp driver with %q: the boots would not compare", a, b.accel)
	}
	b.lv = &lvArm{hv: hv, con: con, launcher: l}
	info, _ := hv.Info(ctx)
	fmt.Fprintf(b.out, "  driver: %s %s, plugin pid %d, libvirt %s, a libvirtd per VM as user %s, started through %s\n",
		m.Binary, info.GetVersion(), b.host.Status(lvDriverName).Pid, fp.GetAttributes()["libvirt-version"], lvUser, l)
	return nil
}

// newLvSlot is the libvirt arm's VM slot i: a run dir of its own (the driver's daemon keeps its
// world in it), short enough for the monitor socket's path.
func newLvSlot(workDir string, i int) slot {
	runDir := filepath.Join(workDir, fmt.Sprintf("lv%d", i))
	return slot{id: fmt.Sprintf("bench-lv-%d", i), runDir: runDir, overlay: filepath.Join(runDir, overlayFile)}
}

// benchLauncher is a kubevisor-launcher holding one libvirt VM's sandbox, started as the node
// handler (and the conformance kit's VM suite) starts one per VMI in standalone mode.
type benchLauncher struct {
	cmd     *exec.Cmd
	log     string
	exited  chan struct{}
	client  *launcher.Client
	sandbox *domainv1.Sandbox
}

// startLauncher starts a launcher for VM id with its directory and log under dir, and
// registers it to be stopped with the VM.
func (b *bencher) startLauncher(ctx context.Context, id, dir string) (*benchLauncher, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	l := &benchLauncher{log: filepath.Join(dir, "launcher.log"), exited: make(chan struct{})}
	logf, err := os.Create(l.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	sockDir := filepath.Join(dir, "l")
	l.cmd = exec.Command(b.lv.launcher, "--dir", sockDir, "--vmi", "kubevisor-bench/"+id, "--grace-period", "10s")
	// A file, not a pipe: waiting for a pipe would wait for the launcher's children too.
	l.cmd.Stdout, l.cmd.Stderr = logf, logf
	// A process group of its own, as the handler's.
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the launcher %s: %w", b.lv.launcher, err)
	}
	go func() {
		_ = l.cmd.Wait()
		close(l.exited)
	}()
	b.mu.Lock()
	b.launchers[id] = l
	b.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, launcherReady)
	defer cancel()
	if l.client, err = launcher.Dial(dctx, filepath.Join(sockDir, launcher.SocketName)); err != nil {
		return nil, fmt.Errorf("the launcher did not serve: %w; its log: %s", err, tailFile(l.log))
	}
	pid := l.client.LauncherPid()
	if pid <= 0 {
		return nil, errors.New("the launcher's pid is not visible from the bench")
	}
	l.sandbox = &domainv1.Sandbox{
		LauncherSocket: filepath.Join(sockDir, launcher.SocketName),
		NetnsPath:      "/proc/" + strconv.Itoa(pid) + "/ns/net",
	}
	return l, nil
}

// stop asks the launcher to exit (its VM is gone by now), then signals its process group.
func (l *benchLauncher) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), launcherExit)
	defer cancel()
	if l.client != nil {
		_ = l.client.Exit(ctx)
		_ = l.client.Close()
	}
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if sig != 0 {
			_ = syscall.Kill(-l.cmd.Process.Pid, sig)
		}
		select {
		case <-l.exited:
			return nil
		case <-time.After(launcherExit / 2):
		}
	}
	return fmt.Errorf("the launcher (pid %d) did not exit", l.cmd.Process.Pid)
}

// tailFile is the end of a log file, for a message.
func tailFile(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 1024 {
		s = s[len(s)-1024:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}

// lvSpec is the domain spec of libvirt slot s in sandbox sb: the bench's guest domain, as the
// qmp arm's.
func (b *bencher) lvSpec(s slot, sb *domainv1.Sandbox) *domainv1.DomainSpec {
	spec := GuestDomain(b.guest, s.id, s.runDir, s.overlay, b.cfg.MemoryBytes)
	spec.Sandbox = sb
	return spec
}

// lvStart prepares slot s, starts its launcher and creates and starts its VM through the
// libvirt plugin, returning the times just before Create, after Create and after Start.
func (b *bencher) lvStart(ctx context.Context, s slot) (t0, t1, t2 time.Time, err error) {
	if err = b.prepare(ctx, s); err != nil {
		return
	}
	l, err := b.startLauncher(ctx, s.id, s.runDir+"-launcher")
	if err != nil {
		return
	}
	spec := b.lvSpec(s, l.sandbox)
	t0 = time.Now()
	if _, err = b.lv.hv.Create(ctx, spec); err != nil {
		err = fmt.Errorf("libvirt: create: %w", err)
		return
	}
	b.track(b.lv.hv, s.id)
	t1 = time.Now()
	if err = b.lv.hv.Start(ctx, s.id); err != nil {
		err = fmt.Errorf("libvirt: start: %w", err)
		return
	}
	t2 = time.Now()
	return
}

// lvBoot boots slot s through the libvirt plugin: a launcher first (not timed: the handler's
// sandbox exists before Create for every driver), then Create, Start, the marker on the
// Console stream.
func (b *bencher) lvBoot(ctx context.Context, s slot) (pluginTimes, error) {
	w := NewMarkerWatcher(b.guest.ReadyMarker)
	ctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	defer b.remove(s.id)
	t0, t1, t2, err := b.lvStart(ctx, s)
	if err != nil {
		return pluginTimes{}, err
	}
	consoleDone := make(chan error, 1)
	go func() { consoleDone <- b.lv.con.Console(ctx, s.id, nil, w) }()
	select {
	case <-w.Found():
	case err := <-consoleDone:
		st, _ := b.lv.hv.Status(context.WithoutCancel(ctx), s.id)
		return pluginTimes{}, fmt.Errorf("libvirt: console ended (%v) before %s; VM %s %s; console: %q",
			err, b.guest.ReadyMarker, st.GetState(), st.GetMessage(), w.Tail())
	case <-ctx.Done():
		return pluginTimes{}, fmt.Errorf("libvirt: no %s: %w; console: %q", b.guest.ReadyMarker, ctx.Err(), w.Tail())
	}
	seen := w.SeenAt()
	pt := pluginTimes{create: t1.Sub(t0), start: t2.Sub(t1), fromCreate: seen.Sub(t0), fromStart: seen.Sub(t1)}
	if b.lv.cmdline == nil {
		st, err := b.lv.hv.Status(ctx, s.id)
		if err != nil {
			return pt, fmt.Errorf("libvirt: status: %w", err)
		}
		if b.lv.cmdline, err = procCmdline(int(st.GetPid())); err != nil {
			return pt, err
		}
	}
	return pt, nil
}

// lvMemory reads the libvirt driver's memory, and each VM's daemon's, with each of cfg.VMs VMs
// booted through it at once, and prints them beside the qmp driver's rows.
func (b *bencher) lvMemory(ctx context.Context, qmpRows []rssRow) ([]lvRow, error) {
	if b.lv == nil || len(b.cfg.VMs) == 0 {
		return nil, nil
	}
	fmt.Fprintf(b.out, "\nlibvirt driver memory: VMs booted through the plugin at once, each under a launcher of its own, read %s after the last reached %s,\n"+
		"median of %d readings of /proc/PID/smaps_rollup per process\n", rssSettle, b.guest.ReadyMarker, rssSamples)
	idle, err := b.driverMem(ctx, lvDriverName)
	if err != nil {
		return nil, err
	}
	var rows []lvRow
	for _, n := range b.cfg.VMs {
		r, err := b.lvMemWith(ctx, n)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	tab := table{w: b.out, widths: []int{4, 10, 10, 10, 10, 10, 10, 10, 10}}
	tab.row("", "driver", "driver", "libvirtd", "libvirtd", "launcher", "launcher", "QEMU", "QEMU")
	tab.row("VMs", "RSS", "PSS", "RSS/VM", "PSS/VM", "RSS/VM", "PSS/VM", "RSS/VM", "PSS/VM")
	tab.row("0", mib(float64(idle.RSS)), mib(float64(idle.PSS)), "-", "-", "-", "-", "-", "-")
	for _, r := range rows {
		rs, ps := r.per(byRSS), r.per(byPSS)
		tab.row(fmt.Sprint(r.vms), mib(float64(r.driver.RSS)), mib(float64(r.driver.PSS)), mib(rs.daemon), mib(ps.daemon),
			mib(rs.launcher), mib(ps.launcher), mib(rs.qemu), mib(ps.qemu))
	}
	var others []string
	for _, r := range rows {
		for _, v := range r.perVM {
			for _, n := range v.otherNames {
				if !slices.Contains(others, n) {
					others = append(others, n)
				}
			}
		}
	}
	if len(others) == 0 {
		fmt.Fprintf(b.out, "  under each launcher: libvirtd and QEMU only (no virtlogd: the driver's daemons write QEMU's output to a file)\n")
	} else {
		fmt.Fprintf(b.out, "  under the launchers besides libvirtd and QEMU (counted as the daemon's \"others\"): %s\n", strings.Join(others, ", "))
	}

	fmt.Fprintf(b.out, "\nmemory per running VM beyond QEMU, qmp against libvirt: a driver's share is its plugin process / N; libvirt adds its per-VM\n"+
		"libvirtd and whatever else runs under the VM's launcher but QEMU. The launcher (kubevisor-launcher alone, shown apart) runs\n"+
		"under the node handler for either driver; this bench runs the qmp arm's QEMUs without one.\n")
	for _, acc := range []accounting{byRSS, byPSS} {
		cells, err := memoryComparison(acc, qmpRows, rows)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(b.out, "  by %s:\n", acc.name)
		tab := table{w: b.out, widths: []int{5, 13, 17, 10, 8, 13, 11, 8, 8, 12}}
		for _, c := range cells {
			tab.row(c...)
		}
	}
	return rows, nil
}

// lvMemWith boots n VMs at once through the libvirt plugin and reads the driver's, the
// launchers', the daemons' and the QEMUs' memory.
func (b *bencher) lvMemWith(ctx context.Context, n int) (lvRow, error) {
	defer b.cleanup()
	bctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	consoleCtx, closeConsoles := context.WithCancel(bctx)
	defer closeConsoles()
	watchers := make([]*MarkerWatcher, n)
	ids := make([]string, n)
	start := time.Now()
	for i := range n {
		s := newLvSlot(b.work, i)
		ids[i] = s.id
		if _, _, _, err := b.lvStart(bctx, s); err != nil {
			return lvRow{}, fmt.Errorf("libvirt VM %d of %d: %w", i+1, n, err)
		}
		w := NewMarkerWatcher(b.guest.ReadyMarker)
		watchers[i] = w
		go func() { _ = b.lv.con.Console(consoleCtx, s.id, nil, w) }()
	}
	for i, w := range watchers {
		select {
		case <-w.Found():
		case <-bctx.Done():
			return lvRow{}, fmt.Errorf("%d libvirt VMs: VM %d did not reach %s: %w; console: %q", n, i+1, b.guest.ReadyMarker, bctx.Err(), w.Tail())
		}
	}
	booted := time.Since(start)
	closeConsoles()
	select {
	case <-time.After(rssSettle):
	case <-ctx.Done():
		return lvRow{}, ctx.Err()
	}
	row := lvRow{vms: n}
	var err error
	if row.driver, err = b.driverMem(ctx, lvDriverName); err != nil {
		return lvRow{}, err
	}
	procs, err := processes()
	if err != nil {
		return lvRow{}, err
	}
	for _, id := range ids {
		b.mu.Lock()
		l := b.launchers[id]
		b.mu.Unlock()
		lpid := l.cmd.Process.Pid
		daemon, qemu, others, err := splitLauncherTree(procs, lpid)
		if err != nil {
			return lvRow{}, fmt.Errorf("VM %s: %w", id, err)
		}
		var v lvVMMem
		if v.launcher, err = medianMem(ctx, lpid); err != nil {
			return lvRow{}, fmt.Errorf("launcher of %s: %w", id, err)
		}
		if v.daemon, err = medianMem(ctx, daemon); err != nil {
			return lvRow{}, fmt.Errorf("libvirtd of %s: %w", id, err)
		}
		if v.qemu, err = medianMem(ctx, qemu); err != nil {
			return lvRow{}, fmt.Errorf("QEMU of %s: %w", id, err)
		}
		var pids []int
		for _, p := range others {
			pids = append(pids, p.pid)
			v.otherNames = append(v.otherNames, p.comm)
		}
		for _, pid := range pids {
			// A process that exited meanwhile (a short-lived helper) counts as nothing.
			if m, err := medianMem(ctx, pid); err == nil {
				v.others = v.others.Add(m)
			}
		}
		row.perVM = append(row.perVM, v)
	}
	fmt.Fprintf(b.out, "  %d libvirt VM(s) running (all booted in %s)\n", n, secs(booted))
	return row, nil
}
