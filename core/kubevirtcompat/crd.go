package kubevirtcompat

import (
	"fmt"
	"strings"
)

// preserveUnknownFields is the schema extension that makes the API server keep fields the
// schema does not list instead of pruning them (or refusing them under strict field validation).
const preserveUnknownFields = "x-kubernetes-preserve-unknown-fields"

// PreserveUnknownFields marks every object schema of the VirtualMachineInstanceSpec inside crd
// (a CustomResourceDefinition decoded from YAML or JSON into maps) to keep unknown fields, so
// that a field Kubevisor does not have reaches the admission webhook, which refuses it with its
// reason (CheckSpec), rather than being refused by the API server as an unknown field. Maps
// (additionalProperties) are left alone. It returns false for a CRD of a kind without such a
// spec.
func PreserveUnknownFields(crd map[string]any) (bool, error) {
	kind, fields, ok := specFields(crd)
	if !ok {
		return false, nil
	}
	versions, _ := dig(crd, "spec", "versions").([]any)
	for _, v := range versions {
		schema := specSchemaIn(v, fields)
		if schema == nil {
			return false, fmt.Errorf("%s: the schema has no %s", kind, strings.Join(fields, "."))
		}
		markObjects(schema)
	}
	return true, nil
}

// specFields returns the kind of crd and, when it is one of SpecPaths' kinds, the fields to its
// VirtualMachineInstanceSpec.
func specFields(crd map[string]any) (string, []string, bool) {
	kind, _ := dig(crd, "spec", "names", "kind").(string)
	fields, ok := SpecPaths[kind]
	return kind, fields, ok
}

// specSchemaIn returns the schema at fields in the CRD version v, or nil.
func specSchemaIn(v any, fields []string) map[string]any {
	schema, _ := dig(v, "schema", "openAPIV3Schema").(map[string]any)
	for _, f := range fields {
		schema, _ = dig(schema, "properties", f).(map[string]any)
	}
	return schema
}

// markObjects sets preserveUnknownFields on schema and every object schema inside it.
func markObjects(schema map[string]any) {
	if schema["type"] == "object" && schema["additionalProperties"] == nil {
		schema[preserveUnknownFields] = true
	}
	props, _ := schema["properties"].(map[string]any)
	for _, p := range props {
		if m, ok := p.(map[string]any); ok {
			markObjects(m)
		}
	}
	if items, ok := schema["items"].(map[string]any); ok {
		markObjects(items)
	}
	if add, ok := schema["additionalProperties"].(map[string]any); ok {
		markObjects(add)
	}
}

// Reaches says whether a field at path (as Node.Leaves writes it) in the VirtualMachineInstanceSpec
// whose schema is spec gets past the API server's schema to admission: the schema lists it, or
// an object schema on its way keeps unknown fields.
func Reaches(spec map[string]any, path string) bool {
	cur := spec
	for part := range strings.SplitSeq(path, ".") {
		if cur[preserveUnknownFields] == true {
			return true
		}
		name, list := strings.CutSuffix(part, "[]")
		next, _ := dig(cur, "properties", name).(map[string]any)
		if next == nil {
			return false
		}
		if list {
			next, _ = next["items"].(map[string]any)
			if next == nil {
				return false
			}
		}
		cur = next
	}
	return true
}

// SpecSchema returns the schema of the VirtualMachineInstanceSpec in the first version of crd
// (decoded into maps), or nil for a CRD of a kind without one.
func SpecSchema(crd map[string]any) map[string]any {
	_, fields, ok := specFields(crd)
	versions, _ := dig(crd, "spec", "versions").([]any)
	if !ok || len(versions) == 0 {
		return nil
	}
	return specSchemaIn(versions[0], fields)
}

// dig returns the value at keys inside v (maps all the way), or nil.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}
