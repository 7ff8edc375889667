package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// vcpuThread is an entry of query-cpus-fast: a vCPU and its thread, by the thread's id in
// QEMU's pid namespace.
type vcpuThread struct {
	Index    int `json:"cpu-index"`
	ThreadID int `json:"thread-id"`
}

// pinThreads places the threads of the QEMU with pid (in the driver's pid namespace) as p says,
// while the guest is stopped (-S): each vCPU's thread, found by query-cpus-fast, on its host CPU
// alone, and, when p has emulator CPUs, every other thread of the process (the main loop, the
// RCU and I/O threads, the thread pool's workers) on those.
//
// query-cpus-fast names threads in QEMU's own pid namespace (the launcher pod's, under a
// launcher); they are mapped to the driver's through /proc/PID/task/TID/status (NSpid), so the
// driver must see QEMU's pid namespace from above or share it, as it must to start QEMU through
// a launcher at all. sched_setaffinity(2) needs the driver to be QEMU's user or to hold
// CAP_SYS_NICE, and fails (EINVAL) for CPUs outside QEMU's cpuset: p comes from the sandbox's
// CPUs, which are that cpuset.
//
// Threads QEMU starts later inherit the affinity of the thread that starts them: the main loop's
// (its thread pool's workers are spawned from a bottom half of the main loop), so they stay on
// the emulator CPUs, or a vCPU's.
func pinThreads(ctx context.Context, mon Monitor, pid int, p *domainv1.CPUPinning) error {
	raw, err := mon.Run(ctx, "query-cpus-fast", nil)
	if err != nil {
		return fmt.Errorf("query-cpus-fast: %w", err)
	}
	var vcpus []vcpuThread
	if err := json.Unmarshal(raw, &vcpus); err != nil {
		return fmt.Errorf("query-cpus-fast: %w", err)
	}
	want := p.GetVcpuHostCpus()
	if len(vcpus) != len(want) {
		return fmt.Errorf("cpu.pinning: QEMU has %d vCPUs, the pinning %d", len(vcpus), len(want))
	}
	threads, err := procfs.Threads(pid)
	if err != nil {
		return fmt.Errorf("threads of QEMU (pid %d): %w", pid, err)
	}
	vcpuTids := map[int]int{} // local tid → vCPU
	for _, c := range vcpus {
		if c.Index < 0 || c.Index >= len(want) {
			return fmt.Errorf("cpu.pinning: QEMU reports vCPU %d of %d", c.Index, len(want))
		}
		tid, ok := threads[c.ThreadID]
		if !ok {
			return fmt.Errorf("cpu.pinning: vCPU %d's thread %d is not a thread of QEMU (pid %d) here", c.Index, c.ThreadID, pid)
		}
		if other, ok := vcpuTids[tid]; ok {
			// Round-robin TCG (thread=single) runs every vCPU on one thread.
			return fmt.Errorf("cpu.pinning: vCPUs %d and %d share thread %d: QEMU does not run a thread per vCPU", other, c.Index, c.ThreadID)
		}
		vcpuTids[tid] = c.Index
		if err := setAffinity(tid, want[c.Index:c.Index+1]); err != nil {
			return fmt.Errorf("cpu.pinning: vCPU %d (thread %d) on host CPU %d: %w", c.Index, tid, want[c.Index], err)
		}
	}
	emulator := p.GetEmulatorHostCpus()
	if len(emulator) == 0 {
		return nil
	}
	tids := make([]int, 0, len(threads))
	for _, tid := range threads {
		if _, ok := vcpuTids[tid]; !ok {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	for _, tid := range tids {
		if err := setAffinity(tid, emulator); err != nil && err != unix.ESRCH { // ESRCH: the thread ended
			return fmt.Errorf("cpu.pinning: QEMU thread %d on the emulator CPUs %v: %w", tid, emulator, err)
		}
	}
	return nil
}

// setAffinity runs thread tid on cpus only.
func setAffinity(tid int, cpus []uint32) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(int(c))
	}
	return unix.SchedSetaffinity(tid, &set)
}
