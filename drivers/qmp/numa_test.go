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
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestNUMANodes boots the test guest with one NUMA node (cpu.numa_cells, as numa
// guestMappingPassthrough makes on this one-node machine): its vCPU pinned to CPU 1, its 128 MiB
// on 2 MiB huge pages bound to host node 0. The guest's kernel finds the node in the ACPI SRAT
// QEMU builds for it (without -numa it prints "No NUMA configuration found"), and QEMU's
// mapping of the hugetlbfs has the policy bind:0 (/proc/PID/numa_maps).
func TestNUMANodes(t *testing.T) {
	const guest, page = 128 << 20, 2 << 20
	requireQEMU(t)
	testenv.File(t, filepath.Join(guestDir(), "vmlinuz"), "guest")
	if _, err := os.Stat("/sys/devices/system/node/node0"); err != nil {
		testenv.Missing(t, "host NUMA node 0: %v", err)
	}
	reserveHugepages(t, guest/page)
	dir := mountHugetlbfs(t, guest)
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ctx := context.Background()
	spec := realGuestSpec(t, "numa")
	spec.Memory = &domainv1.Memory{GuestBytes: guest, Hugepages: &domainv1.Hugepages{PageSizeBytes: page, Path: dir}}
	spec.Cpu = &domainv1.CPU{Sockets: 1, Cores: 1, Threads: 1,
		Pinning:   &domainv1.CPUPinning{VcpuHostCpus: []uint32{1}},
		NumaCells: []*domainv1.NUMACell{{Vcpus: []uint32{0}, MemoryBytes: guest, HostNodes: []uint32{0}}}}
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
	console := out.String()
	if strings.Contains(console, "No NUMA configuration found") || !strings.Contains(console, "SRAT: Node 0 PXM 0") {
		t.Errorf("the guest's kernel did not find NUMA node 0 in the SRAT; its console:\n%s", console)
	}
	for _, line := range strings.Split(console, "\n") {
		if strings.Contains(line, "SRAT") || strings.Contains(line, "NUMA") {
			t.Logf("guest: %s", strings.TrimSpace(line))
		}
	}

	pid := readPIDFile(filepath.Join(spec.GetRunDir(), "qemu.pid"))
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/numa_maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var mapping string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, "file="+dir+"/") {
			mapping = line
		}
	}
	t.Logf("QEMU's numa_maps of its guest memory: %s", mapping)
	if f := strings.Fields(mapping); len(f) < 2 || f[1] != "bind:0" {
		t.Errorf("QEMU maps its guest memory with policy %q, want bind:0 (numa_maps: %q)", f, mapping)
	}
}
