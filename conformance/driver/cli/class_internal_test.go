package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestClassRulesAreTheCRDs: a class file is refused for what the generated HypervisorClass CRD
// refuses, with its words: the parameters rule's message, the launcherCapabilities enum.
func TestClassRulesAreTheCRDs(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "manifests", "crd", "kubevisor.io_hypervisorclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		t.Fatalf("the CRD has %d versions, want one with a schema", len(crd.Spec.Versions))
	}
	props := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties
	rules := props["parameters"].XValidations
	if len(rules) != 1 || rules[0].Message != parametersRefused {
		t.Errorf("the CRD's parameters rules %+v, want one with the message %q", rules, parametersRefused)
	}
	var enum []corev1.Capability
	if items := props["launcherCapabilities"].Items; items != nil && items.Schema != nil {
		for _, v := range items.Schema.Enum {
			var c corev1.Capability
			if err := yaml.Unmarshal(v.Raw, &c); err != nil {
				t.Fatal(err)
			}
			enum = append(enum, c)
		}
	}
	if !slices.Equal(enum, launcherCapabilitiesAllowed) {
		t.Errorf("the CRD's launcherCapabilities enum %v, want %v", enum, launcherCapabilitiesAllowed)
	}
}
