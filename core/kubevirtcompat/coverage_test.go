package kubevirtcompat

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the repository root, seen from this package's directory.
var repoRoot = filepath.Join("..", "..")

// loadSpecSchemas returns, by kind, the VirtualMachineInstanceSpec schema of each generated CRD
// that has one.
func loadSpecSchemas(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "manifests", "crd", "kubevisor.io_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in manifests/crd: %v", err)
	}
	out := map[string]map[string]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd map[string]any
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if s := SpecSchema(crd); s != nil {
			kind, _ := dig(crd, "spec", "names", "kind").(string)
			out[kind] = s
		}
	}
	if len(out) != len(SpecPaths) {
		t.Fatalf("CRDs with a VMI spec: %d, want %d", len(out), len(SpecPaths))
	}
	return out
}

// TestKubeVirtFieldCoverage is the measure of issue 15: how many of KubeVirt's
// VirtualMachineInstanceSpec leaf fields the CRD schemas let through to admission (rather than
// refusing them as unknown), how many Kubevisor implements, and how many admission refuses with a
// reason. Run it with -v to print the figures. It fails when a KubeVirt field does not reach
// admission in one of the CRDs, since the API server would then answer "unknown field".
func TestKubeVirtFieldCoverage(t *testing.T) {
	fields := KubeVirtFields()
	counts := map[Class]int{}
	for _, f := range fields {
		counts[f.Class]++
	}
	schemas := loadSpecSchemas(t)
	kinds := make([]string, 0, len(schemas))
	for k := range schemas {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	n := len(fields)
	pct := func(x int) string { return fmt.Sprintf("%d (%.1f%%)", x, 100*float64(x)/float64(n)) }
	var out bytes.Buffer
	fmt.Fprintf(&out, "KubeVirt %s VirtualMachineInstanceSpec leaf fields: %d\n", KubeVirtAPIVersion, n)
	for _, kind := range kinds {
		reached := 0
		for _, f := range fields {
			if Reaches(schemas[kind], f.Path) {
				reached++
			} else {
				t.Errorf("%s: %s does not reach admission: the API server refuses it as an unknown field", kind, f.Path)
			}
		}
		fmt.Fprintf(&out, "  reach admission through the %s CRD: %s\n", kind, pct(reached))
	}
	fmt.Fprintf(&out, "  implemented by Kubevisor: %s\n", pct(counts[Supported]))
	fmt.Fprintf(&out, "  refused at admission with a reason (not supported): %s\n", pct(counts[NotSupported]))
	fmt.Fprintf(&out, "  planned (refused at admission, naming the issue): %s\n", pct(counts[Planned]))
	t.Log("\n" + out.String())
	if counts[Supported]+counts[NotSupported]+counts[Planned] != n {
		t.Errorf("%d fields are neither implemented nor refused with a reason", counts[Uncovered])
	}
}

// TestPreserveUnknownFields checks the rewrite on a small CRD: every object schema of the spec
// keeps unknown fields, maps and what is outside the spec do not.
func TestPreserveUnknownFields(t *testing.T) {
	var crd map[string]any
	if err := yaml.Unmarshal([]byte(`
spec:
  names: {kind: VirtualMachine}
  versions:
  - schema:
      openAPIV3Schema:
        type: object
        properties:
          status: {type: object, properties: {a: {type: string}}}
          spec:
            type: object
            properties:
              runStrategy: {type: string}
              template:
                type: object
                properties:
                  metadata: {type: object}
                  spec:
                    type: object
                    properties:
                      nodeSelector: {type: object, additionalProperties: {type: string}}
                      volumes:
                        type: array
                        items: {type: object, properties: {name: {type: string}, emptyDisk: {type: object}}}
`), &crd); err != nil {
		t.Fatal(err)
	}
	changed, err := PreserveUnknownFields(crd)
	if err != nil || !changed {
		t.Fatalf("changed %t, %v", changed, err)
	}
	spec := SpecSchema(crd)
	marked := func(keys ...string) bool { return dig(spec, keys...) == true }
	for _, keys := range [][]string{
		{preserveUnknownFields},
		{"properties", "volumes", "items", preserveUnknownFields},
		{"properties", "volumes", "items", "properties", "emptyDisk", preserveUnknownFields},
	} {
		if !marked(keys...) {
			t.Errorf("%v is not set", keys)
		}
	}
	if marked("properties", "nodeSelector", preserveUnknownFields) {
		t.Error("a map keeps unknown fields")
	}
	root := dig(crd, "spec", "versions").([]any)[0]
	for _, keys := range [][]string{
		{"schema", "openAPIV3Schema", "properties", "status", preserveUnknownFields},
		{"schema", "openAPIV3Schema", "properties", "spec", "properties", "template", "properties", "metadata", preserveUnknownFields},
		{"schema", "openAPIV3Schema", "properties", "spec", preserveUnknownFields},
	} {
		if dig(root, keys...) != nil {
			t.Errorf("%v is set outside the VMI spec", keys)
		}
	}
	if !Reaches(spec, "volumes[].dataVolume.name") || !Reaches(spec, "domain.features") {
		t.Error("unknown fields do not reach admission")
	}
	delete(spec, preserveUnknownFields)
	if Reaches(spec, "domain.features") || !Reaches(spec, "volumes[].emptyDisk") || !Reaches(spec, "volumes[].bogus") {
		t.Error("Reaches does not follow the schema")
	}
	if changed, err := PreserveUnknownFields(map[string]any{"spec": map[string]any{"names": map[string]any{"kind": "HypervisorClass"}}}); changed || err != nil {
		t.Errorf("HypervisorClass: %t %v", changed, err)
	}
}

// TestCompatibilityDocIsCurrent fails when docs/kubevirt-compatibility.md is not what make
// generate writes from the field list, Kubevisor's types and the table.
func TestCompatibilityDocIsCurrent(t *testing.T) {
	got, err := os.ReadFile(filepath.Join(repoRoot, DocPath))
	if err != nil {
		t.Fatal(err)
	}
	if want := Markdown(KubeVirtFields(), KubeVirtAPIVersion); !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run make generate", DocPath)
	}
}
