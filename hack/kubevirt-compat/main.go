// Command kubevirt-compat writes what Kubevisor knows of KubeVirt's API from KubeVirt's own Go
// types (kubevirt.io/api, the version in go.mod): the leaf field paths of its
// VirtualMachineInstanceSpec as a Go file of package kubevirtcompat, and
// docs/kubevirt-compatibility.md, the table of those fields against Kubevisor's. make generate
// runs it; kubevirt.io/api stays out of every shipped binary.
package main

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"runtime/debug"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

func main() {
	fieldsOut := flag.String("fields", "core/kubevirtcompat/zz_generated.kubevirt_fields.go", "Go file to write the field list to")
	docOut := flag.String("doc", "docs/kubevirt-compatibility.md", "Markdown file to write the compatibility table to")
	flag.Parse()
	if err := run(*fieldsOut, *docOut); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-compat:", err)
		os.Exit(1)
	}
}

func run(fieldsOut, docOut string) error {
	version, err := kubeVirtAPIVersion()
	if err != nil {
		return err
	}
	fields := kubevirtcompat.TreeOf(reflect.TypeFor[kubevirtv1.VirtualMachineInstanceSpec](),
		kubevirtcompat.StopOutside(kubevirtcompat.KubeVirtModule)).Leaves()
	src, err := kubevirtcompat.FieldsFile(version, fields)
	if err != nil {
		return err
	}
	if err := os.WriteFile(fieldsOut, src, 0o644); err != nil {
		return err
	}
	return os.WriteFile(docOut, kubevirtcompat.Markdown(kubevirtcompat.Classify(fields), version), 0o644)
}

// kubeVirtAPIVersion is the version of kubevirt.io/api this program was built with.
func kubeVirtAPIVersion() (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information")
	}
	for _, m := range info.Deps {
		if m.Path == kubevirtcompat.KubeVirtModule {
			return m.Version, nil
		}
	}
	return "", fmt.Errorf("%s is not a dependency of this build", kubevirtcompat.KubeVirtModule)
}
