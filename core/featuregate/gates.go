package featuregate

import (
	"slices"
	"sort"
)

// State is how a gate stands.
type State string

const (
	// Gated: the feature is off unless the gate is listed; admission refuses the fields it
	// governs.
	Gated State = "Gated"
	// GA: KubeVirt has graduated the gate (its feature is always on there) and Kubevisor has the
	// feature too. The name is accepted and changes nothing.
	GA State = "GA"
)

// The known gates, by KubeVirt's names.
const (
	// HostDisk governs spec.volumes[].hostDisk: a disk image or device at a path of the node.
	HostDisk = "HostDisk"
	// HostDevices governs spec.domain.devices.hostDevices[]: host PCI devices passed through.
	HostDevices = "HostDevices"
	// GPU is KubeVirt's gate of spec.domain.devices.gpus[], GA there since before v1.5: GPUs are
	// admitted without it, in KubeVirt as here.
	GPU = "GPU"
	// LiveMigration is KubeVirt's gate of live migration, GA there: Kubevisor always migrates.
	LiveMigration = "LiveMigration"
	// NUMA is KubeVirt's gate of cpu.numa.guestMappingPassthrough, GA there: Kubevisor always
	// has it.
	NUMA = "NUMA"
)

// Gate is one known gate.
type Gate struct {
	// Name is KubeVirt's name of the gate.
	Name string
	// State says whether the gate must be listed for its feature.
	State State
	// Feature is what the gate governs, for docs and messages.
	Feature string
}

// gates is the table, by name. A gate added here is Gated or GA; a Gated one needs its rule in
// check.go (the tests of this package fail otherwise).
var gates = []Gate{
	{Name: GPU, State: GA, Feature: "spec.domain.devices.gpus: GPUs passed through as host PCI devices"},
	{Name: HostDevices, State: Gated, Feature: "spec.domain.devices.hostDevices: host PCI devices passed through"},
	{Name: HostDisk, State: Gated, Feature: "spec.volumes[].hostDisk: a disk image or block device at a path of the node"},
	{Name: LiveMigration, State: GA, Feature: "live migration (VirtualMachineInstanceMigration, evictionStrategy LiveMigrate)"},
	{Name: NUMA, State: GA, Feature: "spec.domain.cpu.numa.guestMappingPassthrough"},
}

// Gates returns the known gates, by name.
func Gates() []Gate {
	out := slices.Clone(gates)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names returns the names of the known gates, sorted.
func Names() []string {
	var out []string
	for _, g := range gates {
		out = append(out, g.Name)
	}
	sort.Strings(out)
	return out
}

// Lookup returns the gate of name, and whether it is known (names are case-sensitive, as
// KubeVirt's).
func Lookup(name string) (Gate, bool) {
	i := slices.IndexFunc(gates, func(g Gate) bool { return g.Name == name })
	if i < 0 {
		return Gate{}, false
	}
	return gates[i], true
}
