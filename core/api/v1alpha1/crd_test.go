/*
Copyright 2026 The Kubevisor Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// crdDir holds the CRDs that hack/generate-api.sh generates from this package.
var crdDir = filepath.Join("..", "..", "..", "manifests", "crd")

type crdExpectation struct {
	kind       string
	plural     string
	shortNames []string
	scope      apiextensionsv1.ResourceScope
	status     bool
	scale      *apiextensionsv1.CustomResourceSubresourceScale
	// columns maps printer column name to its JSONPath; each must be present.
	columns map[string]string
	// rules are CEL rules that must appear somewhere in the schema.
	rules []string
}

var crdExpectations = map[string]crdExpectation{
	"virtualmachines.kubevisor.io": {
		kind: "VirtualMachine", plural: "virtualmachines", shortNames: []string{"vm", "vms"},
		scope: apiextensionsv1.NamespaceScoped, status: true,
		columns: map[string]string{
			"Age":    ".metadata.creationTimestamp",
			"Status": ".status.printableStatus",
			"Ready":  ".status.conditions[?(@.type=='Ready')].status",
		},
		rules: []string{
			"!(has(self.running) && has(self.runStrategy))",
			"self.type != 'DiskOrCreate' || has(self.capacity)",
			"(has(self.hostDisk)?1:0)+(has(self.persistentVolumeClaim)?1:0)+(has(self.cloudInitNoCloud)?1:0)+(has(self.cloudInitConfigDrive)?1:0)+(has(self.containerDisk)?1:0)+(has(self.ephemeral)?1:0)+(has(self.emptyDisk)?1:0) == 1",
		},
	},
	"virtualmachineinstances.kubevisor.io": {
		kind: "VirtualMachineInstance", plural: "virtualmachineinstances", shortNames: []string{"vmi", "vmis"},
		scope: apiextensionsv1.NamespaceScoped, status: true,
		columns: map[string]string{
			"Age":      ".metadata.creationTimestamp",
			"Phase":    ".status.phase",
			"IP":       ".status.interfaces[0].ipAddress",
			"NodeName": ".status.nodeName",
			"Ready":    ".status.conditions[?(@.type=='Ready')].status",
		},
		rules: []string{
			"self.type != 'DiskOrCreate' || has(self.capacity)",
			"(has(self.hostDisk)?1:0)+(has(self.persistentVolumeClaim)?1:0)+(has(self.cloudInitNoCloud)?1:0)+(has(self.cloudInitConfigDrive)?1:0)+(has(self.containerDisk)?1:0)+(has(self.ephemeral)?1:0)+(has(self.emptyDisk)?1:0) == 1",
		},
	},
	"virtualmachineinstancereplicasets.kubevisor.io": {
		kind: "VirtualMachineInstanceReplicaSet", plural: "virtualmachineinstancereplicasets", shortNames: []string{"vmirs", "vmirss"},
		scope: apiextensionsv1.NamespaceScoped, status: true,
		scale: &apiextensionsv1.CustomResourceSubresourceScale{
			SpecReplicasPath:   ".spec.replicas",
			StatusReplicasPath: ".status.replicas",
			LabelSelectorPath:  ptrTo(".status.labelSelector"),
		},
		columns: map[string]string{
			"Desired": ".spec.replicas",
			"Current": ".status.replicas",
			"Ready":   ".status.readyReplicas",
		},
	},
	"virtualmachineinstancemigrations.kubevisor.io": {
		kind: "VirtualMachineInstanceMigration", plural: "virtualmachineinstancemigrations", shortNames: []string{"vmim", "vmims"},
		scope: apiextensionsv1.NamespaceScoped, status: true,
		columns: map[string]string{
			"Phase": ".status.phase",
			"VMI":   ".spec.vmiName",
		},
	},
	"hypervisorclasses.kubevisor.io": {
		kind: "HypervisorClass", plural: "hypervisorclasses", shortNames: []string{"hvc"},
		scope: apiextensionsv1.ClusterScoped, status: false,
		columns: map[string]string{
			"Driver": ".driver",
		},
		rules: []string{"self == oldSelf"},
	},
	"kubevisors.kubevisor.io": {
		kind: "Kubevisor", plural: "kubevisors", shortNames: []string{"kv"},
		scope: apiextensionsv1.ClusterScoped, status: true,
		columns: map[string]string{
			"Version":     ".status.observedVersion",
			"Available":   ".status.conditions[?(@.type=='Available')].status",
			"Progressing": ".status.conditions[?(@.type=='Progressing')].status",
			"Degraded":    ".status.conditions[?(@.type=='Degraded')].status",
			"Age":         ".metadata.creationTimestamp",
		},
		rules: []string{"!has(self.kind) || has(self.image)"},
	},
	"migrationpolicies.kubevisor.io": {
		kind: "MigrationPolicy", plural: "migrationpolicies", shortNames: []string{"mp"},
		scope: apiextensionsv1.ClusterScoped, status: false,
		columns: map[string]string{"Age": ".metadata.creationTimestamp"},
		rules:   []string{"!quantity(string(self)).isLessThan(quantity('0'))"},
	},
}

func ptrTo[T any](v T) *T { return &v }

// loadCRDs decodes every generated CRD strictly, keyed by metadata.name.
func loadCRDs(t *testing.T) map[string]*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "kubevisor.io_*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The Kubevisor CRD comes with the operator (hack/generate-api.sh).
	files = append(files, filepath.Join(crdDir, "..", "operator", "crd", "kubevisor.io_kubevisors.yaml"))
	if len(files) == 0 {
		t.Fatalf("no CRDs in %s; run hack/generate-api.sh", crdDir)
	}
	crds := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			t.Fatalf("%s: decode CustomResourceDefinition: %v", f, err)
		}
		if want := "kubevisor.io_" + crd.Spec.Names.Plural + ".yaml"; filepath.Base(f) != want {
			t.Errorf("%s: file name should be %s", f, want)
		}
		crds[crd.Name] = crd
	}
	return crds
}

func TestCRDs(t *testing.T) {
	crds := loadCRDs(t)

	var got, want []string
	for name := range crds {
		got = append(got, name)
	}
	for name := range crdExpectations {
		want = append(want, name)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("CRDs = %v, want %v", got, want)
	}

	for name, exp := range crdExpectations {
		t.Run(exp.kind, func(t *testing.T) {
			crd := crds[name]
			if crd.APIVersion != "apiextensions.k8s.io/v1" || crd.Kind != "CustomResourceDefinition" {
				t.Errorf("apiVersion/kind = %s/%s", crd.APIVersion, crd.Kind)
			}
			spec := crd.Spec
			if spec.Group != GroupName {
				t.Errorf("group = %q, want %q", spec.Group, GroupName)
			}
			if spec.Names.Kind != exp.kind || spec.Names.ListKind != exp.kind+"List" || spec.Names.Plural != exp.plural {
				t.Errorf("names = %+v", spec.Names)
			}
			if !slices.Equal(spec.Names.ShortNames, exp.shortNames) {
				t.Errorf("shortNames = %v, want %v", spec.Names.ShortNames, exp.shortNames)
			}
			if !slices.Equal(spec.Names.Categories, []string{"kubevisor"}) {
				t.Errorf("categories = %v, want [kubevisor]", spec.Names.Categories)
			}
			if spec.Scope != exp.scope {
				t.Errorf("scope = %s, want %s", spec.Scope, exp.scope)
			}
			if len(spec.Versions) != 1 {
				t.Fatalf("versions = %d, want 1", len(spec.Versions))
			}
			v := spec.Versions[0]
			if v.Name != GroupVersion.Version || !v.Served || !v.Storage {
				t.Errorf("version %s served=%t storage=%t", v.Name, v.Served, v.Storage)
			}

			hasStatus := v.Subresources != nil && v.Subresources.Status != nil
			if hasStatus != exp.status {
				t.Errorf("status subresource = %t, want %t", hasStatus, exp.status)
			}
			var scale *apiextensionsv1.CustomResourceSubresourceScale
			if v.Subresources != nil {
				scale = v.Subresources.Scale
			}
			switch {
			case exp.scale == nil && scale != nil:
				t.Errorf("unexpected scale subresource %+v", scale)
			case exp.scale != nil && scale == nil:
				t.Errorf("no scale subresource")
			case exp.scale != nil:
				if scale.SpecReplicasPath != exp.scale.SpecReplicasPath ||
					scale.StatusReplicasPath != exp.scale.StatusReplicasPath ||
					scale.LabelSelectorPath == nil || *scale.LabelSelectorPath != *exp.scale.LabelSelectorPath {
					t.Errorf("scale = %+v, want %+v", scale, exp.scale)
				}
			}

			columns := map[string]string{}
			for _, c := range v.AdditionalPrinterColumns {
				columns[c.Name] = c.JSONPath
			}
			for name, path := range exp.columns {
				if columns[name] != path {
					t.Errorf("printer column %q = %q, want %q", name, columns[name], path)
				}
			}

			if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				t.Fatal("no schema")
			}
			rules := map[string]bool{}
			collectRules(v.Schema.OpenAPIV3Schema, rules)
			for _, r := range exp.rules {
				if !rules[r] {
					t.Errorf("CEL rule %q missing; have %v", r, rules)
				}
			}

			if _, errs := structuralSchema(t, crd); len(errs) > 0 {
				t.Errorf("schema is not structural: %v", errs.ToAggregate())
			}
		})
	}
}

// TestCRDsMatchScheme checks that every kind registered by AddToScheme has a CRD and vice versa.
func TestCRDsMatchScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	crdKinds := map[string]bool{}
	for _, crd := range loadCRDs(t) {
		crdKinds[crd.Spec.Names.Kind] = true
		crdKinds[crd.Spec.Names.ListKind] = true
	}
	for kind := range scheme.KnownTypes(GroupVersion) {
		if !crdKinds[kind] && !isMetaKind(kind) {
			t.Errorf("kind %s is registered but has no CRD", kind)
		}
	}
	for kind := range crdKinds {
		if !scheme.Recognizes(GroupVersion.WithKind(kind)) {
			t.Errorf("CRD kind %s is not registered by AddToScheme", kind)
		}
	}
}

// isMetaKind reports whether kind is one of the meta/v1 kinds AddToGroupVersion registers in every group.
func isMetaKind(kind string) bool {
	switch kind {
	case "WatchEvent", "ListOptions", "GetOptions", "DeleteOptions", "CreateOptions", "UpdateOptions", "PatchOptions":
		return true
	}
	return false
}

func TestKustomizationListsCRDs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(crdDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatal(err)
	}
	if k.Kind != "Kustomization" {
		t.Errorf("kind = %q", k.Kind)
	}
	files, err := filepath.Glob(filepath.Join(crdDir, "kubevisor.io_*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		want = append(want, filepath.Base(f))
	}
	got := slices.Clone(k.Resources)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources = %v, want %v", got, want)
	}
}

func collectRules(s *apiextensionsv1.JSONSchemaProps, into map[string]bool) {
	if s == nil {
		return
	}
	for _, r := range s.XValidations {
		into[strings.Join(strings.Fields(r.Rule), " ")] = true
		into[r.Rule] = true
	}
	for _, p := range s.Properties {
		collectRules(&p, into)
	}
	if s.Items != nil {
		collectRules(s.Items.Schema, into)
	}
	if s.AdditionalProperties != nil {
		collectRules(s.AdditionalProperties.Schema, into)
	}
}

// structuralSchema converts a CRD's schema to the structural form the API server uses for pruning
// and validation, and reports the errors the API server would reject the CRD for.
func structuralSchema(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) (*structuralschema.Structural, field.ErrorList) {
	t.Helper()
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatalf("convert schema: %v", err)
	}
	s, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	return s, structuralschema.ValidateStructural(field.NewPath("openAPIV3Schema"), s)
}
