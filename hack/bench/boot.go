// Package bench is `kubevisor-bench`: measurements of Kubevisor against plain QEMU. `boot` times
// the project's test guest from start to its console marker with raw qemu-system-x86_64, with
// the same VM through the qmp hypervisor driver plugin and, given its binary, through the
// libvirt one (a per-VM libvirtd started through a kubevisor-launcher), and reads the drivers'
// memory per running VM beyond QEMU (issue 3 and issue 16, "Measure"). `memory` boots VMs through a node handler with a
// sandbox and launcher each, as `kubevisor-handler run` does, and reads the RSS of QEMU, the
// launcher, the handler and the drivers per running VM (issue 5, "Measure").
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// BootConfig is the configuration of `kubevisor-bench boot`, one field per flag.
type BootConfig struct {
	// GuestDir holds the test guest as `make guest` builds it (conformance.GuestFromDir): its
	// kernel, initramfs and disk image are needed.
	GuestDir string
	// Driver is the qmp hypervisor driver plugin binary.
	Driver string
	// Libvirt is the libvirt hypervisor driver plugin binary; empty leaves its arm out.
	Libvirt string
	// Launcher is the kubevisor-launcher the libvirt arm starts per VM, as the node handler
	// does (the driver starts the VM's libvirtd through it); empty finds it as the conformance
	// kit does (conformance.FindLauncher).
	Launcher string
	// QEMU is the qemu-system-x86_64 of the raw runs; empty searches PATH, as the driver does
	// with its default configuration.
	QEMU string
	// QemuImg makes the VMs' overlay disks.
	QemuImg string
	// Runs is the number of measured pairs of a raw and a plugin boot; Warmup pairs come first
	// and are not counted.
	Runs, Warmup int
	// VMs are the numbers of VMs running through the plugin at which the driver's RSS is read.
	VMs []int
	// MemoryBytes is each VM's guest memory.
	MemoryBytes uint64
	// BootTimeout bounds one boot to the marker (of all VMs at once, for the RSS).
	BootTimeout time.Duration
	// WorkDir holds the VMs' run directories and the plugin host's state; empty means a new
	// temporary directory under /tmp (unix socket paths must stay short), removed at the end.
	WorkDir string
	// LogLevel is the level of the plugin host's and the driver's logs on stderr.
	LogLevel string
}

// Defaults of BootConfig.
const (
	DefaultRuns        = 7
	DefaultWarmup      = 1
	DefaultMemoryBytes = 256 << 20
	DefaultBootTimeout = 2 * time.Minute
)

// DefaultVMs are the VM counts of the RSS reading.
var DefaultVMs = []int{1, 5}

// Aim is the aim for the ratio of the plugin's boot time to raw QEMU's.
const Aim = 1.10

const (
	// driverName is the qmp driver's name on the bench's plugin host.
	driverName = qmp.Name
	// dialInterval is how often a raw run tries QEMU's serial socket while QEMU comes up.
	dialInterval = 5 * time.Millisecond
	// rssSettle is how long the VMs run after they all booted before RSS is read.
	rssSettle = 2 * time.Second
	// rssSamples readings rssInterval apart make each RSS figure (their median).
	rssSamples  = 5
	rssInterval = 200 * time.Millisecond
	// cleanupTimeout bounds killing and deleting a VM at the end of a run.
	cleanupTimeout = 30 * time.Second
)

// pluginTimes are the figures of one boot through the plugin.
type pluginTimes struct {
	create, start time.Duration // the Create and Start calls
	fromCreate    time.Duration // just before Create to the marker on the Console stream
	fromStart     time.Duration // just before Start to the marker
}

// bencher runs the boots of one `kubevisor-bench boot`.
type bencher struct {
	cfg   BootConfig
	out   io.Writer
	guest conformance.Guest
	qemu  string
	accel qmp.Accel
	host  *plugin.Host
	hv    driver.Hypervisor
	con   driver.Consoler
	work  string

	lv *lvArm // the libvirt driver's arm, nil without --driver libvirt=PATH

	mu        sync.Mutex
	live      map[string]driver.Hypervisor // plugin VMs to kill and delete on the way out, by driver
	launchers map[string]*benchLauncher    // their launchers, stopped after them
}

// RunBoot runs the boot benchmark and writes its figures to out; logs go to logOut.
func RunBoot(ctx context.Context, cfg BootConfig, out, logOut io.Writer) (err error) {
	g, err := conformance.GuestFromDir(cfg.GuestDir)
	if err != nil {
		return fmt.Errorf("test guest: %w", err)
	}
	if g.Kernel == "" || g.Disk == "" {
		return fmt.Errorf("test guest: %s must hold %s, %s and %s (make guest)", cfg.GuestDir,
			conformance.GuestKernelFile, conformance.GuestInitrdFile, conformance.GuestDiskFile)
	}
	qemu := cfg.QEMU
	if qemu == "" {
		qemu = "qemu-system-x86_64"
	}
	if qemu, err = exec.LookPath(qemu); err != nil {
		return fmt.Errorf("qemu: %w (install qemu-system-x86)", err)
	}
	work := cfg.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("/tmp", "kvbench-"); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		defer os.RemoveAll(work)
	} else if work, err = filepath.Abs(work); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}

	b := &bencher{cfg: cfg, out: out, guest: g, qemu: qemu, work: work, live: map[string]driver.Hypervisor{}, launchers: map[string]*benchLauncher{}}
	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-bench", Level: hclog.LevelFromString(cfg.LogLevel), Output: logOut})
	err = b.startDriver(ctx, logger)
	if b.host != nil {
		defer func() {
			b.cleanup()
			if cerr := b.host.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("close the plugin host: %w", cerr)
			}
		}()
	}
	if err != nil {
		return err
	}

	raw, plug, lv, err := b.boots(ctx)
	if err != nil {
		return err
	}
	rss, err := b.rss(ctx)
	if err != nil {
		return err
	}
	lvRows, err := b.lvMemory(ctx, rss)
	if err != nil {
		return err
	}
	if st := b.host.Status(driverName); st.Restarts > 0 {
		fmt.Fprintf(out, "\nwarning: the driver's plugin process was restarted %d times during the bench (last error: %s)\n", st.Restarts, st.LastError)
	}
	if st := b.host.Status(lvDriverName); b.lv != nil && st.Restarts > 0 {
		fmt.Fprintf(out, "\nwarning: the libvirt driver's plugin process was restarted %d times during the bench (last error: %s)\n", st.Restarts, st.LastError)
	}
	b.summary(raw, plug, lv, rss, lvRows)
	return nil
}

// startDriver starts the qmp driver plugin and waits for its accelerator probe.
func (b *bencher) startDriver(ctx context.Context, logger hclog.Logger) error {
	m, err := plugin.ManifestFor(b.cfg.Driver, driver.KindHypervisor, driverName)
	if err != nil {
		return err
	}
	host, err := plugin.NewHost(plugin.HostConfig{StateDir: filepath.Join(b.work, "host"), Logger: logger})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := host.Start(sctx, m); err != nil {
		_ = host.Close()
		return err
	}
	b.host = host
	if b.hv, err = host.Hypervisor(driverName); err != nil {
		return err
	}
	caps, err := b.hv.Capabilities(sctx)
	if err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if !driver.HasFeature(caps, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE) || !slices.Contains(caps.GetFirmware(), "kernel") {
		return fmt.Errorf("driver %s declares no console or no kernel boot", b.cfg.Driver)
	}
	var ok bool
	if b.con, ok = driver.Optional[driver.Consoler](sctx, b.hv); !ok {
		return fmt.Errorf("the client of driver %s has no Console", driverName)
	}
	// Create waits for the probe: wait for it here (its first fingerprint), not in a timed run.
	fp, err := firstFingerprint(sctx, b.hv)
	if err != nil {
		return err
	}
	accel := fp.GetAttributes()["accel"]
	if accel == "" {
		return fmt.Errorf("the driver cannot run VMs: %s", fp.GetHealthDescription())
	}
	b.accel = qmp.Accel(accel)
	info, _ := b.hv.Info(sctx)
	against := "the qmp driver plugin"
	if b.cfg.Libvirt != "" {
		against = "the qmp and libvirt driver plugins"
	}
	fmt.Fprintf(b.out, "kubevisor-bench boot: the test guest, start to %s on its serial console, raw QEMU against %s\n", b.guest.ReadyMarker, against)
	fmt.Fprintf(b.out, "  guest:  %s: kernel boot, %d MiB, a virtio qcow2 overlay of %s, serial console on a unix socket\n",
		filepath.Dir(b.guest.Kernel), b.cfg.MemoryBytes>>20, filepath.Base(b.guest.Disk))
	fmt.Fprintf(b.out, "  qemu:   %s %s, accel %s (%s)\n", b.qemu, fp.GetAttributes()["qemu-version"], b.accel, fp.GetHealthDescription())
	fmt.Fprintf(b.out, "  driver: %s %s, plugin pid %d\n", m.Binary, info.GetVersion(), host.Status(driverName).Pid)
	if b.cfg.Libvirt != "" {
		if err := b.startLibvirt(sctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(b.out, "  host:   %d CPUs, load average %s (other work on the node shows as noise between runs)\n", runtime.NumCPU(), loadAvg())
	return nil
}

// loadAvg is the node's 1, 5 and 15 minute load averages.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// firstFingerprint returns the driver's first fingerprint.
func firstFingerprint(ctx context.Context, d driver.Driver) (*basev1.FingerprintResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fp *basev1.FingerprintResponse
	err := d.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error {
		fp = r
		cancel()
		return nil
	})
	if fp == nil {
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("fingerprint of the driver: %w", err)
	}
	return fp, nil
}

// spec is the domain spec of slot s and its command line from qmp.BuildArgs, as the driver
// builds it on this node.
func (b *bencher) spec(s slot) (*domainv1.DomainSpec, []string, error) {
	spec := GuestDomain(b.guest, s.id, s.runDir, s.overlay, b.cfg.MemoryBytes)
	// The driver's default translation cache under TCG (its configuration here is the default).
	cl, err := qmp.BuildArgs(spec, qmp.HostEnv{Accel: b.accel, RunDir: s.runDir, TCGTranslationCacheMiB: qmp.DefaultTCGTranslationCacheMiB})
	if err != nil {
		return nil, nil, fmt.Errorf("build the command line: %w", err)
	}
	if len(cl.ExtraFiles) > 0 || cl.VarsTemplate != "" {
		return nil, nil, errors.New("the command line needs files passed or copied by the driver")
	}
	return spec, cl.Args, nil
}

// boots runs the warm-up and measured pairs of boots, raw and through the qmp plugin (triples,
// with the libvirt plugin's), printing a row per pair. The order rotates every pair, so that no
// arm always goes first.
func (b *bencher) boots(ctx context.Context) (raw []time.Duration, plug, lv []pluginTimes, err error) {
	s := newSlot(b.work, 0)
	spec, args, err := b.spec(s)
	if err != nil {
		return nil, nil, nil, err
	}
	rawArgs, err := RawArgs(args)
	if err != nil {
		return nil, nil, nil, err
	}
	arms := []string{armRaw, armQMP}
	fmt.Fprintf(b.out, "  command line (qmp.BuildArgs; the raw runs drop -S and so need no QMP cont):\n    %s %s\n",
		filepath.Base(b.qemu), strings.Join(args, " "))
	if b.lv != nil {
		arms = append(arms, armLibvirt)
		fmt.Fprintf(b.out, "  libvirt: the same guest (kernel, initramfs, command line, disk overlay, memory, 1 vCPU) as a domain spec to the libvirt plugin, with a\n"+
			"    kubevisor-launcher started for the VM before Create (untimed, as the handler's sandbox); Create→marker includes its libvirtd's start\n")
		fmt.Fprintf(b.out, "  %d warm-up triple(s), not counted, then %d triples of a raw, a qmp and a libvirt boot, the order rotating\n\n", b.cfg.Warmup, b.cfg.Runs)
	} else {
		fmt.Fprintf(b.out, "  %d warm-up pair(s), not counted, then %d pairs of a raw and a plugin boot, in alternating order\n\n", b.cfg.Warmup, b.cfg.Runs)
	}
	tab := table{w: b.out, widths: []int{7, 5, 11, 13, 12, 6, 6, 10}}
	if b.lv != nil {
		tab.widths = append(tab.widths, 13, 12, 7, 7, 11, 11)
		tab.row("", "", "raw", "qmp", "qmp", "qmp", "qmp", "", "libvirt", "libvirt", "libvirt", "libvirt", "", "")
		tab.row("run", "first", "exec→marker", "Create→marker", "Start→marker", "Create", "Start", "qmp/raw",
			"Create→marker", "Start→marker", "Create", "Start", "libvirt/raw", "libvirt/qmp")
	} else {
		tab.row("", "", "raw", "plugin", "plugin", "plugin", "plugin", "")
		tab.row("run", "first", "exec→marker", "Create→marker", "Start→marker", "Create", "Start", "plugin/raw")
	}

	same := 0
	for i := range b.cfg.Warmup + b.cfg.Runs {
		var r time.Duration
		var p, l pluginTimes
		var identical bool
		run := map[string]func() error{
			armRaw: func() (err error) { r, err = b.rawBoot(ctx, s, rawArgs); return err },
			armQMP: func() (err error) { p, identical, err = b.pluginBoot(ctx, s, spec, args); return err },
			armLibvirt: func() (err error) {
				l, err = b.lvBoot(ctx, newLvSlot(b.work, 0))
				return err
			},
		}
		order := armOrder(arms, i)
		for _, arm := range order {
			if err := run[arm](); err != nil {
				return nil, nil, nil, fmt.Errorf("%s boot: %w", arm, err)
			}
		}
		first := map[string]string{armRaw: "raw", armQMP: "plug", armLibvirt: "lv"}[order[0]]
		if b.lv != nil && order[0] == armQMP {
			first = "qmp"
		}
		label := fmt.Sprintf("warm-%d", i+1)
		if i >= b.cfg.Warmup {
			label = fmt.Sprintf("%d", i-b.cfg.Warmup+1)
			raw, plug = append(raw, r), append(plug, p)
			if b.lv != nil {
				lv = append(lv, l)
			}
			if identical {
				same++
			}
		}
		cells := []string{label, first, secs(r), secs(p.fromCreate), secs(p.fromStart), ms(p.create), ms(p.start), ratio(p.fromCreate, r)}
		if b.lv != nil {
			cells = append(cells, secs(l.fromCreate), secs(l.fromStart), ms(l.create), ms(l.start),
				ratio(l.fromCreate, r), ratio(l.fromCreate, p.fromCreate))
		}
		tab.row(cells...)
	}
	med := bootMedians(raw, plug, lv)
	median := func(xs []pluginTimes, f func(pluginTimes) time.Duration) time.Duration { return Median(column(xs, f)) }
	fromStart := func(p pluginTimes) time.Duration { return p.fromStart }
	create := func(p pluginTimes) time.Duration { return p.create }
	start := func(p pluginTimes) time.Duration { return p.start }
	cells := []string{"median", "", secs(med.Raw), secs(med.QMP), secs(median(plug, fromStart)),
		ms(median(plug, create)), ms(median(plug, start)), ratio(med.QMP, med.Raw)}
	if b.lv != nil {
		cells = append(cells, secs(med.Libvirt), secs(median(lv, fromStart)), ms(median(lv, create)), ms(median(lv, start)),
			ratio(med.Libvirt, med.Raw), ratio(med.Libvirt, med.QMP))
	}
	tab.row(cells...)
	fmt.Fprintf(b.out, "\nthe plugin's QEMU ran exactly the command line above (its /proc/PID/cmdline) in %d of %d runs\n", same, b.cfg.Runs)
	if b.lv != nil {
		fmt.Fprintf(b.out, "the libvirt plugin's QEMU (libvirtd's domain of the same spec) ran, in its first boot:\n    %s\n", strings.Join(b.lv.cmdline, " "))
	}
	return raw, plug, lv, nil
}

func column[T any](xs []T, f func(T) time.Duration) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

func ratio(a, b time.Duration) string { return fmtRatio(Ratio(a, b)) }

// prepare gives slot s a new overlay over the guest's disk and removes what a previous run left
// in its run directory.
func (b *bencher) prepare(ctx context.Context, s slot) error {
	if err := os.MkdirAll(s.runDir, 0o700); err != nil {
		return err
	}
	for _, name := range []string{overlayFile, serialSocket, "qmp.sock", "qemu.pid", "qemu.log"} {
		if err := os.Remove(filepath.Join(s.runDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	out, err := exec.CommandContext(ctx, b.cfg.QemuImg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", b.guest.Disk, s.overlay).CombinedOutput()
	if err != nil {
		return fmt.Errorf("create overlay %s: %w: %s", s.overlay, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// rawBoot runs QEMU with args itself, as the driver would (own session, output to qemu.log),
// and returns the time from exec to the marker on the serial socket.
func (b *bencher) rawBoot(ctx context.Context, s slot, args []string) (time.Duration, error) {
	if err := b.prepare(ctx, s); err != nil {
		return 0, err
	}
	return b.runQEMU(ctx, s.runDir, args)
}

// runQEMU runs QEMU with args, whose serial socket is in runDir, until the guest's marker, and
// returns the time from exec to the marker; QEMU is killed then.
func (b *bencher) runQEMU(ctx context.Context, runDir string, args []string) (time.Duration, error) {
	logPath := filepath.Join(runDir, "qemu.log")
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	cmd := exec.Command(b.qemu, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	w := NewMarkerWatcher(b.guest.ReadyMarker)

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("raw qemu: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	conn, err := dialSerial(ctx, filepath.Join(runDir, serialSocket), exited)
	if err != nil {
		return 0, fmt.Errorf("raw qemu: serial console: %w: %s", err, tail(logPath))
	}
	defer conn.Close()
	go func() { _, _ = io.Copy(w, conn) }()
	select {
	case <-w.Found():
		return w.SeenAt().Sub(start), nil
	case <-exited:
		return 0, fmt.Errorf("raw qemu exited before %s: %s; console: %q", b.guest.ReadyMarker, tail(logPath), w.Tail())
	case <-ctx.Done():
		return 0, fmt.Errorf("raw qemu: no %s: %w; console: %q", b.guest.ReadyMarker, ctx.Err(), w.Tail())
	}
}

// dialSerial connects to QEMU's serial socket, retrying while QEMU comes up.
func dialSerial(ctx context.Context, path string, exited <-chan struct{}) (net.Conn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-exited:
			return nil, fmt.Errorf("qemu exited (%w)", err)
		case <-time.After(dialInterval):
		}
	}
}

// tail is the end of a log file, for a message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no qemu log)"
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 1024 {
		s = s[len(s)-1024:]
	}
	return "qemu log: " + strings.ReplaceAll(s, "\n", " | ")
}

// pluginBoot boots slot s through the plugin: Create, Start, the marker on the Console stream.
// It reports whether the VM's QEMU ran exactly want (from /proc/PID/cmdline).
func (b *bencher) pluginBoot(ctx context.Context, s slot, spec *domainv1.DomainSpec, want []string) (pluginTimes, bool, error) {
	if err := b.prepare(ctx, s); err != nil {
		return pluginTimes{}, false, err
	}
	w := NewMarkerWatcher(b.guest.ReadyMarker)
	ctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	defer b.remove(s.id)

	t0 := time.Now()
	if _, err := b.hv.Create(ctx, spec); err != nil {
		return pluginTimes{}, false, fmt.Errorf("plugin: create: %w", err)
	}
	b.track(b.hv, s.id)
	t1 := time.Now()
	if err := b.hv.Start(ctx, s.id); err != nil {
		return pluginTimes{}, false, fmt.Errorf("plugin: start: %w", err)
	}
	t2 := time.Now()
	consoleDone := make(chan error, 1)
	go func() { consoleDone <- b.con.Console(ctx, s.id, nil, w) }()
	select {
	case <-w.Found():
	case err := <-consoleDone:
		st, _ := b.hv.Status(context.WithoutCancel(ctx), s.id)
		return pluginTimes{}, false, fmt.Errorf("plugin: console ended (%v) before %s; VM %s %s; console: %q",
			err, b.guest.ReadyMarker, st.GetState(), st.GetMessage(), w.Tail())
	case <-ctx.Done():
		return pluginTimes{}, false, fmt.Errorf("plugin: no %s: %w; console: %q", b.guest.ReadyMarker, ctx.Err(), w.Tail())
	}
	seen := w.SeenAt()
	pt := pluginTimes{create: t1.Sub(t0), start: t2.Sub(t1), fromCreate: seen.Sub(t0), fromStart: seen.Sub(t1)}
	st, err := b.hv.Status(ctx, s.id)
	if err != nil {
		return pt, false, fmt.Errorf("plugin: status: %w", err)
	}
	got, err := procCmdline(int(st.GetPid()))
	if err != nil {
		return pt, false, err
	}
	same := len(got) > 0 && got[0] == b.qemu && slices.Equal(got[1:], want)
	if !same {
		fmt.Fprintf(b.out, "warning: the plugin's QEMU ran another command line:\n    %s\n", strings.Join(got, " "))
	}
	return pt, same, nil
}

// procCmdline is the command line of a process.
func procCmdline(pid int) ([]string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("command line of qemu (pid %d): %w", pid, err)
	}
	return strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00"), nil
}

func (b *bencher) track(hv driver.Hypervisor, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[id] = hv
}

// remove kills and deletes a plugin VM, then stops its launcher if it has one.
func (b *bencher) remove(id string) {
	b.mu.Lock()
	hv := b.live[id]
	l := b.launchers[id]
	delete(b.live, id)
	delete(b.launchers, id)
	b.mu.Unlock()
	if hv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		if err := hv.Kill(ctx, id); err != nil {
			fmt.Fprintf(b.out, "warning: kill VM %s: %v\n", id, err)
		}
		if err := hv.Delete(ctx, id); err != nil {
			fmt.Fprintf(b.out, "warning: delete VM %s: %v\n", id, err)
		}
		cancel()
	}
	if l != nil {
		if err := l.stop(); err != nil {
			fmt.Fprintf(b.out, "warning: launcher of VM %s: %v\n", id, err)
		}
	}
}

// cleanup removes every plugin VM still running: the driver leaves its QEMUs running when its
// process ends.
func (b *bencher) cleanup() {
	b.mu.Lock()
	ids := make([]string, 0, len(b.live)+len(b.launchers))
	for id := range b.live {
		ids = append(ids, id)
	}
	for id := range b.launchers {
		if b.live[id] == nil {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { b.remove(id) })
	}
	wg.Wait()
}

// summary prints the closing lines.
func (b *bencher) summary(raw []time.Duration, plug, lv []pluginTimes, rss []rssRow, lvRows []lvRow) {
	med := bootMedians(raw, plug, lv)
	mr, mc := med.Raw, med.QMP
	ratio := Ratio(mc, mr)
	verdict := "met"
	if ratio > Aim {
		verdict = "NOT met"
	}
	fmt.Fprintf(b.out, "\nload average at the end: %s\n", loadAvg())
	for i := 1; i < len(rss); i++ {
		r := rss[i]
		fmt.Fprintf(b.out, "driver RSS with %d running VM(s): %s, %s per running VM\n", r.vms, mib(float64(r.driver)), mib(float64(r.driver)/float64(r.vms)))
	}
	for _, r := range lvRows {
		rs, ps := r.per(byRSS), r.per(byPSS)
		fmt.Fprintf(b.out, "libvirt with %d running VM(s), per running VM beyond QEMU: %s RSS, %s PSS (driver share, libvirtd and what else it started)\n",
			r.vms, mib(rs.beyond), mib(ps.beyond))
	}
	fmt.Fprintf(b.out, "boot-to-marker median: raw %s, plugin %s, ratio %.3f (aim ≤ %.2f: %s)\n", secs(mr), secs(mc), ratio, Aim, verdict)
	if len(lv) > 0 {
		fmt.Fprintf(b.out, "boot-to-marker median, libvirt plugin: %s;", secs(med.Libvirt))
		for _, r := range med.Ratios() {
			fmt.Fprintf(b.out, " %s %s", r.Name, fmtRatio(r.Value))
		}
		fmt.Fprintln(b.out)
	}
}
