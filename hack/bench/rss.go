package bench

import (
	"context"
	"fmt"
	"os"
	"time"
)

// rssRow is the memory of the driver with a number of VMs running through it.
type rssRow struct {
	vms     int
	driver  uint64 // the driver process's VmRSS, bytes (median of rssSamples readings)
	qemuAvg uint64 // the VMs' QEMU processes' mean VmRSS, bytes
	// driverMem and qemuMem are the same readings with PSS and anonymous memory: the driver's
	// medians, the QEMUs' mean.
	driverMem, qemuMem MemUsage
}

// driverMem reads the memory of driver name's plugin process rssSamples times, rssInterval
// apart, and returns the medians.
func (b *bencher) driverMem(ctx context.Context, name string) (MemUsage, error) {
	pid := b.host.Status(name).Pid
	if pid <= 0 {
		return MemUsage{}, fmt.Errorf("the %s driver's plugin process is not running", name)
	}
	m, err := medianMem(ctx, pid)
	if err != nil {
		return MemUsage{}, fmt.Errorf("%s driver memory: %w", name, err)
	}
	return m, nil
}

// readMem reads a process's /proc/PID/smaps_rollup.
func readMem(pid int) (MemUsage, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return MemUsage{}, err
	}
	m, err := ParseSmapsRollup(raw)
	if err != nil {
		return MemUsage{}, fmt.Errorf("/proc/%d/smaps_rollup: %w", pid, err)
	}
	return m, nil
}

// medianMem reads a process's memory rssSamples times, rssInterval apart, and returns the
// median of each accounting.
func medianMem(ctx context.Context, pid int) (MemUsage, error) {
	var rss, pss, anon []uint64
	for i := range rssSamples {
		if i > 0 {
			select {
			case <-time.After(rssInterval):
			case <-ctx.Done():
				return MemUsage{}, ctx.Err()
			}
		}
		m, err := readMem(pid)
		if err != nil {
			return MemUsage{}, err
		}
		rss, pss, anon = append(rss, m.RSS), append(pss, m.PSS), append(anon, m.Anon)
	}
	return MemUsage{RSS: Median(rss), PSS: Median(pss), Anon: Median(anon)}, nil
}

// rss reads the driver's RSS with no VM, then with each of cfg.VMs VMs booted through it at
// once and left running for rssSettle.
func (b *bencher) rss(ctx context.Context) ([]rssRow, error) {
	if len(b.cfg.VMs) == 0 {
		return nil, nil
	}
	fmt.Fprintf(b.out, "\ndriver memory: VMs booted through the plugin at once, read %s after the last reached %s (console streams closed), median of %d readings of VmRSS\n",
		rssSettle, b.guest.ReadyMarker, rssSamples)
	idleMem, err := b.driverMem(ctx, driverName)
	if err != nil {
		return nil, err
	}
	idle := idleMem.RSS
	rows := []rssRow{{vms: 0, driver: idle, driverMem: idleMem}}
	for _, n := range b.cfg.VMs {
		row, err := b.rssWith(ctx, n)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}

	tab := table{w: b.out, widths: []int{4, 10, 10, 14, 19, 15}}
	tab.row("VMs", "driver RSS", "over 0 VMs", "per running VM", "growth per added VM", "QEMU RSS per VM")
	for i, r := range rows {
		if r.vms == 0 {
			tab.row("0", mib(float64(r.driver)), "-", "-", "-", "-")
			continue
		}
		prev := rows[i-1]
		over := float64(r.driver) - float64(idle)
		growth := (float64(r.driver) - float64(prev.driver)) / float64(r.vms-prev.vms)
		tab.row(fmt.Sprint(r.vms), mib(float64(r.driver)), signedMiB(over), mib(float64(r.driver)/float64(r.vms)),
			fmt.Sprintf("%s (%d→%d)", signedMiB(growth), prev.vms, r.vms), mib(float64(r.qemuAvg)))
	}
	return rows, nil
}

func signedMiB(b float64) string {
	if b >= 0 {
		return "+" + mib(b)
	}
	return mib(b)
}

// rssWith boots n VMs at once through the plugin and reads the driver's and their QEMUs' RSS.
func (b *bencher) rssWith(ctx context.Context, n int) (rssRow, error) {
	slots := make([]slot, n)
	defer b.cleanup()
	bctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	watchers := make([]*MarkerWatcher, n)
	consoleCtx, closeConsoles := context.WithCancel(bctx)
	defer closeConsoles()
	start := time.Now()
	for i := range slots {
		s := newSlot(b.work, i)
		slots[i] = s
		spec, _, err := b.spec(s)
		if err != nil {
			return rssRow{}, err
		}
		if err := b.prepare(ctx, s); err != nil {
			return rssRow{}, err
		}
		if _, err := b.hv.Create(bctx, spec); err != nil {
			return rssRow{}, fmt.Errorf("create VM %d of %d: %w", i+1, n, err)
		}
		b.track(b.hv, s.id)
		if err := b.hv.Start(bctx, s.id); err != nil {
			return rssRow{}, fmt.Errorf("start VM %d of %d: %w", i+1, n, err)
		}
		w := NewMarkerWatcher(b.guest.ReadyMarker)
		watchers[i] = w
		go func() { _ = b.con.Console(consoleCtx, s.id, nil, w) }()
	}
	for i, w := range watchers {
		select {
		case <-w.Found():
		case <-bctx.Done():
			return rssRow{}, fmt.Errorf("%d VMs: VM %d did not reach %s: %w; console: %q", n, i+1, b.guest.ReadyMarker, bctx.Err(), w.Tail())
		}
	}
	booted := time.Since(start)
	closeConsoles()
	select {
	case <-time.After(rssSettle):
	case <-ctx.Done():
		return rssRow{}, ctx.Err()
	}
	row := rssRow{vms: n}
	var err error
	if row.driverMem, err = b.driverMem(ctx, driverName); err != nil {
		return rssRow{}, err
	}
	row.driver = row.driverMem.RSS
	var total MemUsage
	for _, s := range slots {
		st, err := b.hv.Status(ctx, s.id)
		if err != nil {
			return rssRow{}, fmt.Errorf("status of %s: %w", s.id, err)
		}
		q, err := readMem(int(st.GetPid()))
		if err != nil {
			return rssRow{}, fmt.Errorf("QEMU memory of %s: %w", s.id, err)
		}
		total = total.Add(q)
	}
	row.qemuMem = MemUsage{RSS: total.RSS / uint64(n), PSS: total.PSS / uint64(n), Anon: total.Anon / uint64(n)}
	row.qemuAvg = row.qemuMem.RSS
	fmt.Fprintf(b.out, "  %d VM(s) running (all booted in %s)\n", n, secs(booted))
	return row, nil
}
