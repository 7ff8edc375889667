// Command crd-unknown-fields rewrites the generated CRDs given as arguments so that the API server
// keeps the fields of a VirtualMachineInstanceSpec that the schema does not list
// (kubevirtcompat.PreserveUnknownFields): the admission webhook then refuses a field Kubevisor
// does not have with its reason instead of the API server with "unknown field". Nothing unknown
// is stored: the webhook refuses every such field. hack/generate-api.sh runs it after
// controller-gen; CRDs of other kinds are left as they are.
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

func main() {
	for _, f := range os.Args[1:] {
		if err := rewrite(f); err != nil {
			fmt.Fprintf(os.Stderr, "crd-unknown-fields: %s: %v\n", f, err)
			os.Exit(1)
		}
	}
}

func rewrite(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return err
	}
	changed, err := kubevirtcompat.PreserveUnknownFields(crd)
	if err != nil || !changed {
		return err
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	// controller-gen starts each file with a document separator; keep it.
	return os.WriteFile(file, append([]byte("---\n"), out...), 0o644)
}
