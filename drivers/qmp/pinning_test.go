package qmp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/internal/procfs"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// cpusAllowed is the Cpus_allowed_list of thread tid of pid, from /proc/PID/task/TID/status.
func cpusAllowed(t *testing.T, pid, tid int) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in /proc/%d/task/%d/status", pid, tid)
	return ""
}

// threadsByName are the threads of pid by their names (/proc/PID/task/TID/comm); QEMU names
// its threads with debug-threads=on: "CPU 0/TCG" (or "/KVM") for vCPU 0's.
func threadsByName(t *testing.T, pid int) map[string]int {
	t.Helper()
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	out := map[string]int{}
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue
		}
		var tid int
		fmt.Sscan(filepath.Base(d), &tid)
		out[strings.TrimSpace(string(raw))] = tid
	}
	return out
}

// TestCPUPinning boots the test guest with cpu.pinning on this machine's CPUs 0 and 1 and reads
// back, from /proc, where each of QEMU's threads may run: each vCPU thread (found by the name
// QEMU gives it, not by the driver's query-cpus-fast) on its host CPU alone; with emulator CPUs,
// the main thread and every other thread there; without, the main thread where QEMU started (the
// test's CPUs). The guest comes up pinned.
func TestCPUPinning(t *testing.T) {
	requireQEMU(t)
	testenv.File(t, filepath.Join(guestDir(), "vmlinuz"), "guest")
	mine, err := procfs.Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) < 2 || mine[0] != 0 || mine[1] != 1 {
		testenv.Missing(t, "the test runs on CPUs %v; it pins onto CPUs 0 and 1", mine)
	}
	all := cpuList(mine)
	cases := []struct {
		name     string
		sockets  uint32
		pinning  *domainv1.CPUPinning
		vcpus    []string // Cpus_allowed_list of vCPU i's thread
		emulator string   // of the main thread and every thread that is not a vCPU's
	}{
		{name: "vCPU on CPU 1, the emulator isolated on CPU 0", sockets: 1,
			pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}, EmulatorHostCpus: []uint32{0}},
			vcpus:   []string{"1"}, emulator: "0"},
		{name: "vCPU on CPU 1, the emulator where it started", sockets: 1,
			pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}},
			vcpus:   []string{"1"}, emulator: all},
		{name: "vCPU 0 on CPU 1, vCPU 1 on CPU 0", sockets: 2,
			pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1, 0}},
			vcpus:   []string{"1", "0"}, emulator: all},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, t.TempDir())
			h := inProcess(t, d)
			ctx := context.Background()
			spec := realGuestSpec(t, fmt.Sprintf("pinning-%d", i))
			spec.Cpu = &domainv1.CPU{Sockets: tc.sockets, Cores: 1, Threads: 1, Pinning: tc.pinning}
			if _, err := h.Create(ctx, spec); err != nil {
				t.Fatalf("Create: %v", err)
			}
			if err := h.Start(ctx, spec.GetId()); err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer func() {
				if err := h.Kill(ctx, spec.GetId()); err != nil {
					t.Errorf("Kill: %v", err)
				}
			}()
			out, _, _ := attachConsole(t, h, spec.GetId())
			out.waitCount(t, GuestReadyMarker, 1, 120*time.Second)

			pid := readPIDFile(filepath.Join(spec.GetRunDir(), "qemu.pid"))
			threads := threadsByName(t, pid)
			vcpuTids := map[int]bool{}
			for v, want := range tc.vcpus {
				name := fmt.Sprintf("CPU %d/TCG", v)
				tid, ok := threads[name]
				if !ok {
					name = fmt.Sprintf("CPU %d/KVM", v)
					tid, ok = threads[name]
				}
				if !ok {
					t.Fatalf("QEMU (pid %d) has no thread of vCPU %d: %v", pid, v, threads)
				}
				vcpuTids[tid] = true
				got := cpusAllowed(t, pid, tid)
				t.Logf("vCPU %d: thread %d (%q) Cpus_allowed_list %s", v, tid, name, got)
				if got != want {
					t.Errorf("vCPU %d's thread %d may run on CPUs %s, want %s", v, tid, got, want)
				}
			}
			if got := cpusAllowed(t, pid, pid); got != tc.emulator {
				t.Errorf("QEMU's main thread may run on CPUs %s, want %s", got, tc.emulator)
			} else {
				t.Logf("main thread %d Cpus_allowed_list %s", pid, got)
			}
			for name, tid := range threads {
				if vcpuTids[tid] {
					continue
				}
				if got := cpusAllowed(t, pid, tid); got != tc.emulator {
					t.Errorf("QEMU's thread %d (%q) may run on CPUs %s, want %s (the emulator's)", tid, name, got, tc.emulator)
				}
			}
		})
	}
}

// TestCPUPinningThroughLauncher pins a VM whose QEMU a kubevisor-launcher started in a pid
// namespace of its own, as in a launcher pod: query-cpus-fast names the vCPU thread by its id
// in that namespace, which the driver maps to its own. The vCPU thread (found by its name, in
// this namespace) runs on CPU 1 alone, QEMU's main thread on CPU 0.
func TestCPUPinningThroughLauncher(t *testing.T) {
	requireQEMU(t)
	mine, err := procfs.Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) < 2 || mine[0] != 0 || mine[1] != 1 {
		testenv.Missing(t, "the test runs on CPUs %v; it pins onto CPUs 0 and 1", mine)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, sock, lc, _ := launcherInNamespaces(ctx, t)
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	spec := echoSpec(t, "pinning-launcher", true, 0)
	spec.Sandbox = &domainv1.Sandbox{LauncherSocket: sock, NetnsPath: fmt.Sprintf("/proc/%d/ns/net", lc.LauncherPid())}
	spec.Cpu = &domainv1.CPU{Sockets: 1, Cores: 1, Threads: 1,
		Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}, EmulatorHostCpus: []uint32{0}}}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() { _ = h.Kill(context.Background(), spec.GetId()) }()
	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	st, err := h.Status(ctx, spec.GetId())
	if err != nil {
		t.Fatal(err)
	}
	pid := int(st.GetPid())
	inner, err := procfs.InnermostPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	if inner == pid {
		t.Fatalf("QEMU (pid %d here) has the same pid in its own namespace: not in the launcher's pid namespace", pid)
	}
	tid, ok := threadsByName(t, pid)["CPU 0/TCG"]
	if !ok {
		tid, ok = threadsByName(t, pid)["CPU 0/KVM"]
	}
	if !ok {
		t.Fatalf("QEMU (pid %d) has no thread of vCPU 0", pid)
	}
	t.Logf("QEMU: pid %d here, %d in the launcher's namespace; vCPU 0's thread %d", pid, inner, tid)
	if got := cpusAllowed(t, pid, tid); got != "1" {
		t.Errorf("vCPU 0's thread may run on CPUs %s, want 1", got)
	}
	if got := cpusAllowed(t, pid, pid); got != "0" {
		t.Errorf("QEMU's main thread may run on CPUs %s, want 0", got)
	}
}

// cpuList writes cpus as the kernel's list format does ("0-1").
func cpuList(cpus []uint32) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
