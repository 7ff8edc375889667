package kubevirtcompat

// SpecPaths are, for each kind whose objects carry a VirtualMachineInstanceSpec, the fields
// from the object to that spec.
var SpecPaths = map[string][]string{
	"VirtualMachineInstance":           {"spec"},
	"VirtualMachine":                   {"spec", "template", "spec"},
	"VirtualMachineInstanceReplicaSet": {"spec", "template", "spec"},
}
