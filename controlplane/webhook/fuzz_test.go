package webhook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/randfill"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// checkSpec is what holds for any spec: Default and Validate do not panic, Default is
// idempotent, and every rejection names a field.
func checkSpec(t *testing.T, spec *v1alpha1.VirtualMachineInstanceSpec) {
	t.Helper()
	check := func(stage string) {
		for _, err := range Validate(spec, field.NewPath("spec")) {
			if err.Field == "" {
				t.Fatalf("%s: a rejection without a field path: %v", stage, err)
			}
		}
	}
	check("before defaulting")
	Default(spec, DefaultOptions{HypervisorClassName: "default"})
	once, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	Default(spec, DefaultOptions{HypervisorClassName: "default"})
	twice, _ := json.Marshal(spec)
	if string(once) != string(twice) {
		t.Fatalf("Default is not idempotent:\n%s\n%s", once, twice)
	}
	check("after defaulting")
}

// seedSpecs are the KubeVirt example manifests of core/api's tests and this package's valid
// spec, as JSON specs.
func seedSpecs(t testing.TB) [][]byte {
	var seeds [][]byte
	add := func(s *v1alpha1.VirtualMachineInstanceSpec) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	add(minimalSpec())
	add(validSpec())
	files, err := filepath.Glob(filepath.Join(envtest.RepoRoot(), "core", "api", "v1alpha1", "testdata", "kubevirt", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no seed manifests: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Each manifest is a VMI (spec), or a VM or replica set (spec.template.spec).
		var obj struct {
			Spec struct {
				v1alpha1.VirtualMachineInstanceSpec `json:",inline"`
				Template                            *v1alpha1.VirtualMachineInstanceTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if obj.Spec.Template != nil {
			add(&obj.Spec.Template.Spec)
		} else {
			add(&obj.Spec.VirtualMachineInstanceSpec)
		}
	}
	return seeds
}

// FuzzValidate feeds Default and Validate specs decoded from JSON, or, when the input is not a
// spec in JSON, filled at random from the input bytes (randfill). The seed corpus runs with
// `go test`; `go test -fuzz=FuzzValidate ./controlplane/webhook` explores further.
func FuzzValidate(f *testing.F) {
	for _, s := range seedSpecs(f) {
		f.Add(s)
	}
	f.Add([]byte("random bytes that randfill turns into a spec"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec v1alpha1.VirtualMachineInstanceSpec
		if err := json.Unmarshal(data, &spec); err != nil {
			spec = v1alpha1.VirtualMachineInstanceSpec{}
			randfill.NewFromGoFuzz(data).NilChance(0.3).NumElements(0, 3).MaxDepth(8).Fill(&spec)
		}
		checkSpec(t, &spec)
	})
}

// TestValidateRandomSpecs runs checkSpec over specs randfill makes from fixed seeds, so that
// every `go test` covers a spread of odd specs beyond the fuzz corpus.
func TestValidateRandomSpecs(t *testing.T) {
	for seed := int64(0); seed < 300; seed++ {
		var spec v1alpha1.VirtualMachineInstanceSpec
		randfill.NewWithSeed(seed).NilChance(0.3).NumElements(0, 3).MaxDepth(8).Fill(&spec)
		checkSpec(t, &spec)
	}
}
