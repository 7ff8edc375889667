package assemble

import (
	"fmt"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// StandInDir is the directory of every path in StandIns: it exists nowhere.
const StandInDir = "/stand-in"

// standInCPUs are host CPUs enough for any VMI's dedicatedCpuPlacement: a CPU per vCPU and
// one for the emulator.
var standInCPUs = func() []uint32 {
	cpus := make([]uint32, domain.MaxVCPUs+1)
	for i := range cpus {
		cpus[i] = uint32(i)
	}
	return cpus
}()

// standInNUMA puts every stand-in CPU in host NUMA node 0.
var standInNUMA = func() map[uint32]uint32 {
	m := make(map[uint32]uint32, len(standInCPUs))
	for _, c := range standInCPUs {
		m[c] = 0
	}
	return m
}()

// StandIns are Inputs with a stand-in for every driver result Domain needs: a prepared raw disk
// for each of volumes (by name), an interface result with its own tap and MAC for each of
// interfaces, a run directory, a kernel, a hugetlbfs directory and a persistent state directory. Given them, Domain reports only what is wrong with
// the VMI itself: the admission webhook's dry run, where there are no drivers, and the node
// handler's check of a VMI before it calls any driver use them. The caller sets what is the
// node's rather than a driver's (Acceleration, the buses, a kernel it has resolved).
func StandIns(volumes, interfaces []string) Inputs {
	in := Inputs{
		Disks:      make(map[string]*storagev1.PreparedDisk, len(volumes)),
		Interfaces: make(map[string]*networkv1.InterfaceResult, len(interfaces)),
		RunDir:     StandInDir,
		Kernel:     &KernelArtifacts{KernelPath: StandInDir + "/kernel"},
		// Whether the sandbox has the VMI's huge pages is the sandbox's business.
		HugepagesDir: StandInDir + "/hugepages",
		// Whether it has the CPUs dedicatedCpuPlacement needs is the node's business.
		CPUs: standInCPUs,
		// One NUMA node: the guest's NUMA nodes are the node's business.
		HostNUMANodes: standInNUMA,
		// Where the VM's persistent state is on the node is the node's business.
		PersistentStateDir: StandInDir + "/persistent-state",
	}
	for _, v := range volumes {
		in.Disks[v] = &storagev1.PreparedDisk{VolumeName: v, Path: StandInDir + "/" + v, Format: domainv1.DiskFormat_DISK_FORMAT_RAW}
	}
	for i, name := range interfaces {
		in.Interfaces[name] = &networkv1.InterfaceResult{Name: name, TapName: fmt.Sprintf("tap%d", i), Mac: fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8&0xff, i&0xff)}
	}
	return in
}
