package kubevirtcompat

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The Go modules whose types the trees are read from.
const (
	KubeVirtModule  = "kubevirt.io/api"
	KubevisorModule = "github.com/kubevisor/kubevisor"
)

// Class is how Kubevisor stands to one KubeVirt field.
type Class string

// Classes.
const (
	// Supported: Kubevisor's VirtualMachineInstanceSpec has the field.
	Supported Class = "supported"
	// NotSupported: Kubevisor does not have the field, and an Entry says why.
	NotSupported Class = "not supported"
	// Planned: Kubevisor does not have the field yet, and an issue plans it.
	Planned Class = "planned"
	// Uncovered: Kubevisor does not have the field and no Entry covers it (a test fails on it).
	Uncovered Class = "uncovered"
)

// Field is one leaf field of KubeVirt's VirtualMachineInstanceSpec and how Kubevisor stands to it.
type Field struct {
	// Path is the field's path in the spec, as Node.Leaves writes it.
	Path  string
	Class Class
	// Entry is the entry that covers the field when it is not supported or planned.
	Entry *Entry
}

// kubeVirtSpec is what the generated field list knows of KubeVirt's spec.
var kubeVirtSpec = TreeFromLeaves(kubeVirtFields)

// kubevisorSpec is the tree of Kubevisor's VirtualMachineInstanceSpec, compared with KubeVirt's:
// Kubernetes' own types are leaves in both.
var kubevisorSpec = TreeOf(reflect.TypeFor[v1alpha1.VirtualMachineInstanceSpec](), StopOutside(KubevisorModule))

// KubevisorSupports says whether Kubevisor's VirtualMachineInstanceSpec has the field at path.
func KubevisorSupports(path string) bool { return kubevisorSpec.Has(path) }

// covers says whether the entry at prefix covers the field at path.
func covers(prefix, path string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+".") || strings.HasPrefix(path, prefix+"[]")
}

// EntryFor returns the entry that covers the field at path: of those whose Path is path or a
// prefix of it, the longest.
func EntryFor(path string) (*Entry, bool) {
	var best *Entry
	for i := range entries {
		e := &entries[i]
		if covers(e.Path, path) && (best == nil || len(e.Path) > len(best.Path)) {
			best = e
		}
	}
	return best, best != nil
}

// Classify says how Kubevisor stands to each of the KubeVirt fields at paths.
func Classify(paths []string) []Field {
	out := make([]Field, 0, len(paths))
	for _, p := range paths {
		f := Field{Path: p, Class: Uncovered}
		switch e, ok := EntryFor(p); {
		case KubevisorSupports(p):
			f.Class = Supported
		case ok && e.Planned():
			f.Class, f.Entry = Planned, e
		case ok:
			f.Class, f.Entry = NotSupported, e
		}
		out = append(out, f)
	}
	return out
}

// KubeVirtFields classifies every leaf field of KubeVirt's VirtualMachineInstanceSpec.
func KubeVirtFields() []Field { return Classify(kubeVirtFields) }

// KubeVirtFieldPaths returns the leaf field paths of KubeVirt's VirtualMachineInstanceSpec, as
// generated from the version KubeVirtAPIVersion names.
func KubeVirtFieldPaths() []string { return append([]string(nil), kubeVirtFields...) }

// Message is what admission answers for a field the entry covers: "not supported by Kubevisor:
// <reason>; use <alternative>", or for a planned one "not supported by Kubevisor yet: planned in
// issue <n>" with the reason and alternative that it has.
func (e Entry) Message() string {
	var b strings.Builder
	if e.Planned() {
		fmt.Fprintf(&b, "not supported by Kubevisor yet: planned in issue %d", e.Issue)
		if e.Reason != "" {
			b.WriteString(" (" + e.Reason + ")")
		}
	} else {
		b.WriteString("not supported by Kubevisor: " + e.Reason)
	}
	if e.Alternative != "" {
		b.WriteString("; use " + e.Alternative)
	}
	return b.String()
}
