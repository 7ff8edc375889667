package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// checkCPUPinning: a VM of one vCPU whose domain spec pins the vCPU to one of the kit's CPUs
// and the emulator to another runs every thread of its process (Status.pid) on one of the two:
// its main thread on the emulator's CPU alone, and at least one thread, the vCPU's, on the
// vCPU's CPU alone. The kit must run on at least two CPUs.
func (s *vmSuite) checkCPUPinning(t T) {
	s.requireDevice(t, driver.DeviceCPUPinning, "-", "")
	cpus, err := procfs.Affinity(0)
	if err != nil {
		t.Fatalf("the kit's CPUs: %v", err)
	}
	if len(cpus) < 2 {
		t.Skipf("the kit runs on one CPU (%v): pinning a vCPU apart from the emulator needs two", cpus)
	}
	vcpu, emulator := cpus[len(cpus)-1], cpus[0]
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) {
		spec.Cpu = &domainv1.CPU{Sockets: 1, Cores: 1, Threads: 1,
			Pinning: &domainv1.CPUPinning{VcpuHostCpus: []uint32{vcpu}, EmulatorHostCpus: []uint32{emulator}}}
	})
	pid := int(s.status(t, vm).GetPid())
	if pid == 0 {
		t.Fatalf("the driver reports no VM process (Status.pid): the kit cannot see its threads")
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the threads of the VM process %d: %v", pid, err)
	}
	want := map[string]bool{fmt.Sprint(vcpu): true, fmt.Sprint(emulator): true}
	onVCPU := 0
	for _, task := range tasks {
		allowed, err := cpusAllowed(filepath.Join(task, "status"))
		if err != nil {
			continue // the thread ended
		}
		switch {
		case !want[allowed]:
			t.Errorf("thread %s of the VM process may run on CPUs %s, want %d (the vCPU's) or %d (the emulator's)", filepath.Base(task), allowed, vcpu, emulator)
		case allowed == fmt.Sprint(vcpu):
			onVCPU++
		}
	}
	if onVCPU == 0 {
		t.Errorf("no thread of the VM process runs on CPU %d alone, where cpu.pinning puts vCPU 0", vcpu)
	}
	main, err := cpusAllowed(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if main != fmt.Sprint(emulator) {
		t.Errorf("the VM process's main thread may run on CPUs %s, want %d (cpu.pinning.emulatorHostCpus)", main, emulator)
	}
}

// cpusAllowed is the Cpus_allowed_list of a /proc status file.
func cpusAllowed(status string) (string, error) {
	raw, err := os.ReadFile(status)
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no Cpus_allowed_list in %s", status)
}
