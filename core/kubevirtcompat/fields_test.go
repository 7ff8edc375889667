package kubevirtcompat

import (
	"reflect"
	"runtime/debug"
	"slices"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// TestKubeVirtFieldsMatchTypes fails when the generated field list drifts from KubeVirt's Go
// types (kubevirt.io/api in go.mod): run make generate.
func TestKubeVirtFieldsMatchTypes(t *testing.T) {
	got := TreeOf(reflect.TypeFor[kubevirtv1.VirtualMachineInstanceSpec](), StopOutside(KubeVirtModule)).Leaves()
	if !slices.Equal(got, kubeVirtFields) {
		for _, p := range got {
			if !slices.Contains(kubeVirtFields, p) {
				t.Errorf("KubeVirt has %s, the generated list does not", p)
			}
		}
		for _, p := range kubeVirtFields {
			if !slices.Contains(got, p) {
				t.Errorf("the generated list has %s, KubeVirt does not", p)
			}
		}
		t.Fatal("zz_generated.kubevirt_fields.go is stale: run make generate")
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build information")
	}
	for _, m := range info.Deps {
		if m.Path == KubeVirtModule && m.Version != KubeVirtAPIVersion {
			t.Fatalf("the list is of %s %s, the build has %s: run make generate", KubeVirtModule, KubeVirtAPIVersion, m.Version)
		}
	}
	// A few fields every reader of KubeVirt's API knows, to show the paths are what they seem.
	for _, p := range []string{"domain.devices.rng", "domain.features.hyperv.relaxed.enabled",
		"domain.devices.interfaces[].slirp", "networks[].multus.networkName", "affinity", "tolerations",
		"domain.resources.requests"} {
		if !slices.Contains(kubeVirtFields, p) {
			t.Errorf("%s is not in the list", p)
		}
	}
}
