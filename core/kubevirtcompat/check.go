package kubevirtcompat

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// UnknownField is the detail of an error for a field that neither Kubevisor's API nor KubeVirt's
// has.
const UnknownField = "unknown field: neither Kubevisor's API nor KubeVirt's has it"

// docHint ends the message for a KubeVirt object whose fields are not supported for different
// reasons, when the object itself carries none of them to name.
const docHint = "not supported by Kubevisor: see docs/kubevirt-compatibility.md for its fields"

// ownSpec is Kubevisor's VirtualMachineInstanceSpec down to the fields of Kubernetes' own
// types, which the CRD lets through as well (their schemas keep unknown fields too).
var ownSpec = TreeOf(reflect.TypeFor[v1alpha1.VirtualMachineInstanceSpec](), nil)

// CheckObject is CheckSpec for the spec inside the JSON object raw of kind (one of SpecPaths'
// kinds; others have nothing to check). An object without that spec has nothing to check.
func CheckObject(kind string, raw []byte) (field.ErrorList, error) {
	fields, ok := SpecPaths[kind]
	if !ok || len(raw) == 0 {
		return nil, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decode %s: %w", kind, err)
	}
	var spec any = obj
	for _, f := range fields {
		m, ok := spec.(map[string]any)
		if !ok {
			return nil, nil
		}
		spec = m[f]
	}
	return CheckSpec(spec, field.NewPath(fields[0], fields[1:]...)), nil
}

// CheckSpec returns one error for each field of spec (a VirtualMachineInstanceSpec decoded from
// JSON into maps and slices) that Kubevisor's API does not have, at the field's path under
// path: Forbidden with the Entry's Message for a field of KubeVirt's API, and with UnknownField
// for a field of neither API. It looks at field names only; values are the schema's and the
// validation's concern.
func CheckSpec(spec any, path *field.Path) field.ErrorList {
	return checkOwn(spec, ownSpec, kubeVirtSpec, path, "")
}

// checkOwn checks value against own, Kubevisor's tree at the field, and theirs, KubeVirt's there
// (nil when KubeVirt has no such field). norm is the field's path as entries write it.
func checkOwn(value any, own, theirs *Node, path *field.Path, norm string) field.ErrorList {
	obj, ok := value.(map[string]any)
	if !ok || own.Opaque() {
		return nil
	}
	var errs field.ErrorList
	for _, name := range sortedKeys(obj) {
		ownChild, theirChild := own.Child(name), theirs.Child(name)
		childPath, childNorm := path.Child(name), childPath(norm, name)
		switch {
		case ownChild != nil:
			errs = append(errs, eachElement(obj[name], ownChild.List, childPath, childNorm, func(v any, p *field.Path, n string) field.ErrorList {
				return checkOwn(v, ownChild, theirChild, p, n)
			})...)
		case theirChild != nil:
			errs = append(errs, notSupported(obj[name], theirChild, childPath, childNorm)...)
		default:
			errs = append(errs, field.Forbidden(childPath, UnknownField))
		}
	}
	return errs
}

// notSupported reports the KubeVirt field at norm, which Kubevisor does not have: at the field
// itself when one entry speaks for all of it, else at the fields inside it that value sets
// (entries inside it say something else).
func notSupported(value any, theirs *Node, path *field.Path, norm string) field.ErrorList {
	e, covered := EntryFor(norm)
	if !covered || hasEntryInside(norm) {
		if theirs.List {
			if list, ok := value.([]any); ok && len(list) > 0 {
				var errs field.ErrorList
				for i, v := range list {
					errs = append(errs, notSupportedInside(v, theirs, path.Index(i), elemPath(norm))...)
				}
				return errs
			}
		} else if obj, ok := value.(map[string]any); ok && len(obj) > 0 {
			return notSupportedInside(obj, theirs, path, norm)
		}
	}
	if covered {
		return field.ErrorList{field.Forbidden(path, e.Message())}
	}
	return field.ErrorList{field.Forbidden(path, messageUnder(norm))}
}

// hasEntryInside says whether an entry is for a field inside the one at norm.
func hasEntryInside(norm string) bool {
	for _, e := range entries {
		if e.Path != norm && covers(norm, e.Path) {
			return true
		}
	}
	return false
}

// notSupportedInside reports each field of the KubeVirt object value at norm.
func notSupportedInside(value any, theirs *Node, path *field.Path, norm string) field.ErrorList {
	obj, ok := value.(map[string]any)
	if !ok || len(obj) == 0 {
		if e, ok := EntryFor(norm); ok {
			return field.ErrorList{field.Forbidden(path, e.Message())}
		}
		return field.ErrorList{field.Forbidden(path, messageUnder(norm))}
	}
	var errs field.ErrorList
	for _, name := range sortedKeys(obj) {
		child := theirs.Child(name)
		if child == nil {
			errs = append(errs, field.Forbidden(path.Child(name), UnknownField))
			continue
		}
		errs = append(errs, notSupported(obj[name], child, path.Child(name), childPath(norm, name))...)
	}
	return errs
}

// messageUnder is the message for the KubeVirt object at norm that no entry covers: that of the
// entries of its fields when they agree, else a pointer to the table.
func messageUnder(norm string) string {
	var msgs []string
	for _, f := range KubeVirtFields() {
		if f.Entry != nil && covers(norm, f.Path) && !slices.Contains(msgs, f.Entry.Message()) {
			msgs = append(msgs, f.Entry.Message())
		}
	}
	if len(msgs) == 1 {
		return msgs[0]
	}
	return docHint
}

// eachElement calls check for value, or for each element of it when list.
func eachElement(value any, list bool, path *field.Path, norm string, check func(any, *field.Path, string) field.ErrorList) field.ErrorList {
	if !list {
		return check(value, path, norm)
	}
	elems, _ := value.([]any)
	var errs field.ErrorList
	for i, v := range elems {
		errs = append(errs, check(v, path.Index(i), elemPath(norm))...)
	}
	return errs
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
