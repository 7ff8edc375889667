package featuregate

import (
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// use is one field of a spec that a gate governs: its path and its value (the whole list
// element, name included, which an update must keep equal to pass without the gate).
type use struct {
	path  *field.Path
	value any
}

// rule is what one gate governs in a VMI spec found at path.
type rule struct {
	gate string
	uses func(spec *v1alpha1.VirtualMachineInstanceSpec, path *field.Path) []use
}

// rules are the fields each gate governs. A GA gate's rule never refuses (the gate is always
// enabled); it is here so that the gate's fields are written down once.
var rules = []rule{
	{gate: HostDisk, uses: func(s *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) []use {
		var out []use
		for i := range s.Volumes {
			if s.Volumes[i].HostDisk != nil {
				out = append(out, use{p.Child("volumes").Index(i).Child("hostDisk"), s.Volumes[i]})
			}
		}
		return out
	}},
	{gate: HostDevices, uses: func(s *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) []use {
		var out []use
		for i, h := range s.Domain.Devices.HostDevices {
			out = append(out, use{p.Child("domain", "devices", "hostDevices").Index(i), h})
		}
		return out
	}},
	{gate: GPU, uses: func(s *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) []use {
		var out []use
		for i, g := range s.Domain.Devices.GPUs {
			out = append(out, use{p.Child("domain", "devices", "gpus").Index(i), g})
		}
		return out
	}},
}

// NotEnabled is the refusal of the field at p, governed by gate, which is not enabled:
//
//	spec.volumes[0].hostDisk: Forbidden: feature gate HostDisk is not enabled (add it to the Kubevisor's spec.configuration.featureGates)
func NotEnabled(p *field.Path, gate string) *field.Error {
	return field.Forbidden(p, fmt.Sprintf("feature gate %s is not enabled (add it to the Kubevisor's spec.configuration.featureGates)", gate))
}

// Check returns NotEnabled for each field of spec (a VMI spec found at path: spec, or
// spec.template.spec of a VM or replica set) whose gate enabled does not enable.
//
// old is the spec before an update (nil on create). A field old already had, the same list
// element with the same value, passes: a gate decides what is added, so that turning it off
// leaves the objects that use it updatable (a VM's runStrategy, its labels, its finalizers: a
// VM that can still be stopped and deleted). KubeVirt checks the object as it is instead.
func Check(spec, old *v1alpha1.VirtualMachineInstanceSpec, path *field.Path, enabled Set) field.ErrorList {
	if spec == nil {
		return nil
	}
	var errs field.ErrorList
	for _, r := range rules {
		if enabled.Enabled(r.gate) {
			continue
		}
		var had []use
		if old != nil {
			had = r.uses(old, path)
		}
		for _, u := range r.uses(spec, path) {
			if kept(u, had) {
				continue
			}
			errs = append(errs, NotEnabled(u.path, r.gate))
		}
	}
	return errs
}

// kept says whether an equal element is among had.
func kept(u use, had []use) bool {
	for _, h := range had {
		if apiequality.Semantic.DeepEqual(u.value, h.value) {
			return true
		}
	}
	return false
}
