package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The CPU a VMI's QEMU spends on its boot. The node's busy baseline (e2ebaseline.go) has each
// of its pods spend as much from its first container's start, so that it meets the CPU
// contention the VMIs meet: under TCG every booting guest keeps a core busy, and twenty of them
// on two cores slow every later pod start on the node, Kubevisor's or not.

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's utime and stime: 100 on every
// Linux architecture Kubevisor runs on (it is fixed by the ABI, whatever the kernel's HZ).
const clockTicks = 100

// cpuSettle is how long apart the two reads of the QEMUs' CPU time are, to know each guest's idle
// rate after its boot.
const cpuSettle = 3 * time.Second

// ParseProcCPU returns the user plus system CPU time in the text of /proc/PID/stat.
func ParseProcCPU(stat []byte) (time.Duration, error) {
	s := string(stat)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, fmt.Errorf("stat: no command name in parentheses")
	}
	// After the name: state(3) ppid(4) ... utime(14) stime(15), so fields[11] and fields[12].
	fields := strings.Fields(s[end+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: CPU time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

func procCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return ParseProcCPU(stat)
}

// BootCPU estimates the CPU a guest spent up to its console marker from two reads of its
// QEMU's CPU time after the marker: first at t1, then at t2; the rate between them is the
// idle guest's, taken off for the time from the marker to t1.
func BootCPU(marker, t1, t2 time.Time, cpu1, cpu2 time.Duration) time.Duration {
	idleRate := 0.0
	if t2.After(t1) && cpu2 > cpu1 {
		idleRate = float64(cpu2-cpu1) / float64(t2.Sub(t1))
	}
	boot := cpu1
	if t1.After(marker) {
		boot -= time.Duration(idleRate * float64(t1.Sub(marker)))
	}
	return max(boot, 0)
}

// readBootCPU reads each VM's QEMU CPU time twice, cpuSettle apart, and sets its bootCPU.
func (b *e2eBench) readBootCPU(ctx context.Context) error {
	read := func() (map[*e2eVM]time.Duration, time.Time, error) {
		out := map[*e2eVM]time.Duration{}
		at := time.Now()
		for _, vm := range b.vms {
			c, err := procCPU(vm.qemuPID)
			if err != nil {
				return nil, at, fmt.Errorf("VMI %s: QEMU's CPU time: %w", vm.name, err)
			}
			out[vm] = c
		}
		return out, at, nil
	}
	cpu1, t1, err := read()
	if err != nil {
		return err
	}
	if err := sleep(ctx, cpuSettle); err != nil {
		return err
	}
	cpu2, t2, err := read()
	if err != nil {
		return err
	}
	for vm := range cpu1 {
		vm.bootCPU = BootCPU(vm.marker, t1, t2, cpu1[vm], cpu2[vm])
	}
	return nil
}

// medianBootCPU is the VMs' median boot CPU, rounded to 10 ms.
func (b *e2eBench) medianBootCPU() time.Duration {
	var all []time.Duration
	for _, vm := range b.vms {
		all = append(all, vm.bootCPU)
	}
	slices.Sort(all)
	if len(all) == 0 {
		return 0
	}
	return all[len(all)/2].Round(10 * time.Millisecond)
}
