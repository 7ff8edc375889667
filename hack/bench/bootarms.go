package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Names of the hypervisor drivers `kubevisor-bench boot` knows, as --driver NAME=PATH takes them.
const (
	armQMP     = "qmp"
	armLibvirt = "libvirt"
	armRaw     = "raw"
)

// ParseDriverArg parses one --driver value: NAME=PATH for a driver the boot bench knows (qmp,
// libvirt), or a bare PATH, which is the qmp driver's (the flag's meaning before the libvirt
// arm). A value whose part before "=" holds a slash is a bare path.
func ParseDriverArg(v string) (name, path string, err error) {
	v = strings.TrimSpace(v)
	name, path = armQMP, v
	if before, after, ok := strings.Cut(v, "="); ok && !strings.Contains(before, "/") {
		name, path = before, after
	}
	switch {
	case name != armQMP && name != armLibvirt:
		return "", "", fmt.Errorf("unknown driver %q in %q (want qmp=PATH or libvirt=PATH)", name, v)
	case path == "":
		return "", "", fmt.Errorf("no binary for driver %s in %q", name, v)
	}
	return name, path, nil
}

// driversFlag is --driver, which may be given once per driver: it sets BootConfig.Driver (qmp)
// and BootConfig.Libvirt. A driver named twice is an error; the qmp default is replaced.
type driversFlag struct {
	cfg  *BootConfig
	seen map[string]bool
}

func (f *driversFlag) String() string {
	if f == nil || f.cfg == nil {
		return ""
	}
	s := armQMP + "=" + f.cfg.Driver
	if f.cfg.Libvirt != "" {
		s += "," + armLibvirt + "=" + f.cfg.Libvirt
	}
	return s
}

func (f *driversFlag) Set(v string) error {
	name, path, err := ParseDriverArg(v)
	if err != nil {
		return err
	}
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	if f.seen[name] {
		return fmt.Errorf("driver %s given twice", name)
	}
	f.seen[name] = true
	if name == armLibvirt {
		f.cfg.Libvirt = path
	} else {
		f.cfg.Driver = path
	}
	return nil
}

// armOrder is the order of the arms in measured pair (or triple) i: the arms rotated by i, so
// that each goes first, second and last equally often.
func armOrder(arms []string, i int) []string {
	if len(arms) == 0 {
		return nil
	}
	k := i % len(arms)
	return append(slices.Clone(arms[k:]), arms[:k]...)
}

// Ratio is a/b, or NaN when b is not positive (a missing figure).
func Ratio(a, b time.Duration) float64 {
	if b <= 0 || a <= 0 {
		return math.NaN()
	}
	return a.Seconds() / b.Seconds()
}

// fmtRatio formats a ratio with three decimals, "-" for a missing one.
func fmtRatio(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	return fmt.Sprintf("%.3f", r)
}

// BootMedians are the medians of the arms' boot to the marker: raw from exec, the plugins from
// just before Create. Libvirt is zero when its arm did not run.
type BootMedians struct {
	Raw, QMP, Libvirt time.Duration
}

// bootMedians takes the medians of the measured runs.
func bootMedians(raw []time.Duration, qmpRuns, lvRuns []pluginTimes) BootMedians {
	fromCreate := func(p pluginTimes) time.Duration { return p.fromCreate }
	return BootMedians{Raw: Median(raw), QMP: Median(column(qmpRuns, fromCreate)), Libvirt: Median(column(lvRuns, fromCreate))}
}

// BootRatio is one named ratio of medians.
type BootRatio struct {
	Name  string
	Value float64
}

// Ratios are the ratios of the medians: qmp/raw, and with the libvirt arm libvirt/raw and
// libvirt/qmp.
func (m BootMedians) Ratios() []BootRatio {
	out := []BootRatio{{"qmp/raw", Ratio(m.QMP, m.Raw)}}
	if m.Libvirt > 0 {
		out = append(out, BootRatio{"libvirt/raw", Ratio(m.Libvirt, m.Raw)}, BootRatio{"libvirt/qmp", Ratio(m.Libvirt, m.QMP)})
	}
	return out
}

// lvVMMem is what one libvirt VM's launcher holds, each process's median reading: the launcher
// itself, its libvirtd, anything else the daemon started (others, by name), and QEMU.
type lvVMMem struct {
	launcher, daemon, others, qemu MemUsage
	otherNames                     []string
}

// lvRow is the memory with a number of VMs running through the libvirt driver.
type lvRow struct {
	vms    int
	driver MemUsage
	perVM  []lvVMMem
}

// lvPerVM is an lvRow per running VM, in bytes: the driver's share (its memory / VMs), the mean
// daemon and other processes, their sum beyond QEMU, and the mean launcher and QEMU.
type lvPerVM struct {
	driverShare, daemon, others, beyond, launcher, qemu float64
}

func (r lvRow) per(acc accounting) lvPerVM {
	if r.vms == 0 {
		return lvPerVM{}
	}
	n := float64(r.vms)
	var d, o, l, q uint64
	for _, v := range r.perVM {
		d, o, l, q = d+acc.of(v.daemon), o+acc.of(v.others), l+acc.of(v.launcher), q+acc.of(v.qemu)
	}
	k := float64(max(len(r.perVM), 1))
	p := lvPerVM{driverShare: float64(acc.of(r.driver)) / n, daemon: float64(d) / k, others: float64(o) / k, launcher: float64(l) / k, qemu: float64(q) / k}
	p.beyond = p.driverShare + p.daemon + p.others
	return p
}

// splitLauncherTree sorts the descendants of a libvirt VM's launcher: libvirtd (the daemon the
// driver started through it), QEMU (which the daemon forked and the launcher, a subreaper,
// adopted) and anything else. It fails unless there is exactly one of each of the first two.
func splitLauncherTree(procs []procSnapshot, launcherPid int) (daemon, qemu int, others []procSnapshot, err error) {
	byPid := map[int]procSnapshot{}
	for _, p := range procs {
		byPid[p.pid] = p
	}
	var daemons, qemus []int
	for _, pid := range descendants(procs, launcherPid) {
		p := byPid[pid]
		switch {
		case isQEMU(p.comm):
			qemus = append(qemus, pid)
		case p.comm == "libvirtd":
			daemons = append(daemons, pid)
		default:
			others = append(others, p)
		}
	}
	if len(daemons) != 1 || len(qemus) != 1 {
		return 0, 0, nil, fmt.Errorf("launcher %d runs %d libvirtd and %d QEMU processes, want one of each", launcherPid, len(daemons), len(qemus))
	}
	return daemons[0], qemus[0], others, nil
}

// memoryComparison is the table of memory per running VM beyond QEMU of the qmp and libvirt
// drivers by one accounting, a row per VM count both measured: the header row first.
func memoryComparison(acc accounting, qmpRows []rssRow, lvRows []lvRow) ([][]string, error) {
	out := [][]string{{"VMs", "qmp: driver/N", "libvirt: driver/N", "+ libvirtd", "+ others", "= beyond QEMU", "libvirt-qmp", "launcher", "QEMU qmp", "QEMU libvirt"}}
	byVMs := map[int]rssRow{}
	for _, r := range qmpRows {
		if r.vms > 0 {
			byVMs[r.vms] = r
		}
	}
	for _, lr := range lvRows {
		qr, ok := byVMs[lr.vms]
		if !ok {
			return nil, fmt.Errorf("no qmp figures with %d VMs", lr.vms)
		}
		if lr.vms == 0 {
			return nil, errors.New("a libvirt row of 0 VMs")
		}
		q := float64(acc.of(qr.driverMem)) / float64(qr.vms)
		p := lr.per(acc)
		out = append(out, []string{fmt.Sprint(lr.vms), mib(q), mib(p.driverShare), mib(p.daemon), mib(p.others), mib(p.beyond),
			signedMiB(p.beyond - q), mib(p.launcher), mib(float64(acc.of(qr.qemuMem))), mib(p.qemu)})
	}
	return out, nil
}
