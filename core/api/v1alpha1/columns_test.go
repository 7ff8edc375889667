package v1alpha1

import (
	"reflect"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// kubeVirtColumns are the printer columns of KubeVirt's kubevirt.io/v1 CRDs, in their order, that
// `kubectl get vm,vmi` shows; Kubevisor's CRDs must have them in that order, and may add their
// own after them (kubevisorColumns).
var kubeVirtColumns = map[string][]apiextensionsv1.CustomResourceColumnDefinition{
	"virtualmachines": {
		{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
		{Name: "Status", Description: "Human Readable Status", Type: "string", JSONPath: ".status.printableStatus"},
		{Name: "Ready", Type: "string", JSONPath: ".status.conditions[?(@.type=='Ready')].status"},
	},
	"virtualmachineinstances": {
		{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
		{Name: "Phase", Type: "string", JSONPath: ".status.phase"},
		{Name: "IP", Type: "string", JSONPath: ".status.interfaces[0].ipAddress"},
		{Name: "NodeName", Type: "string", JSONPath: ".status.nodeName"},
		{Name: "Ready", Type: "string", JSONPath: ".status.conditions[?(@.type=='Ready')].status"},
		{Name: "Live-Migratable", Type: "string", JSONPath: ".status.conditions[?(@.type=='LiveMigratable')].status", Priority: 1},
		{Name: "Paused", Type: "string", JSONPath: ".status.conditions[?(@.type=='Paused')].status", Priority: 1},
	},
}

// kubevisorColumns are the columns Kubevisor adds after KubeVirt's: only with priority 1 (kubectl
// get -o wide), so that the default output reads as KubeVirt's.
var kubevisorColumns = map[string][]apiextensionsv1.CustomResourceColumnDefinition{
	"virtualmachineinstances": {
		{Name: "Class", Type: "string", JSONPath: ".status.hypervisorClassName", Priority: 1},
		{Name: "Driver", Type: "string", JSONPath: ".status.hypervisorDriver", Priority: 1},
	},
}

func TestPrinterColumnsAreKubeVirts(t *testing.T) {
	crds := loadCRDs(t)
	for plural, want := range kubeVirtColumns {
		crd, ok := crds[plural+"."+GroupVersion.Group]
		if !ok {
			t.Errorf("no CRD %s.%s", plural, GroupVersion.Group)
			continue
		}
		want = append(append([]apiextensionsv1.CustomResourceColumnDefinition(nil), want...), kubevisorColumns[plural]...)
		for _, v := range crd.Spec.Versions {
			if !reflect.DeepEqual(v.AdditionalPrinterColumns, want) {
				t.Errorf("%s %s printer columns:\n got %+v\nwant %+v", plural, v.Name, v.AdditionalPrinterColumns, want)
			}
		}
	}
}
