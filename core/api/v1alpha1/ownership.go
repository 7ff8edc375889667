package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Every writer of VMI status writes its own fields and conditions by server-side apply under
// its own field manager, so that the API server refuses (with a conflict) a write of one writer
// to a field that another owns, and a writer's apply leaves the others' fields alone.
// docs/architecture.md ("VMI status: one writer per field") has the table of which writer owns
// what, and the hand-over rule of the lifecycle fields.

// Field managers of the writers of VMI status.
const (
	// VMIControllerFieldManager is the VMI controller's field manager.
	VMIControllerFieldManager = "kubevisor-vmi-controller"
	// MigrationControllerFieldManager is the migration controller's field manager.
	MigrationControllerFieldManager = "kubevisor-migration-controller"
	// EvacuationFieldManager is the field manager of status.evacuationNodeName: the eviction
	// webhook of kubevisor-api sets it, the evacuation controller removes it.
	EvacuationFieldManager = "kubevisor-evacuation"
	// handlerFieldManagerPrefix followed by a node name is that node's handler's field manager.
	handlerFieldManagerPrefix = "kubevisor-handler/"
)

// maxFieldManager is the longest field manager the API server accepts.
const maxFieldManager = 128

// HandlerFieldManager is the field manager of the node handler of node: one per node, so that
// the handlers of a migration's source and target are two writers to the API server too.
func HandlerFieldManager(node string) string {
	m := handlerFieldManagerPrefix + node
	if len(m) > maxFieldManager {
		sum := sha256.Sum256([]byte(node))
		m = handlerFieldManagerPrefix + hex.EncodeToString(sum[:16])
	}
	return m
}

// FieldManagers returns the field managers that own the field at path in obj, as its
// managedFields say, each once. A path is in the managedFields' own notation: "f:status",
// "f:phase" for status.phase; "f:status", "f:conditions", `k:{"type":"Ready"}` for the Ready
// condition.
func FieldManagers(obj metav1.Object, path ...string) []string {
	var out []string
	for _, mf := range obj.GetManagedFields() {
		var fields map[string]any
		if err := json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields); err != nil {
			continue
		}
		if owns(fields, path) && !slices.Contains(out, mf.Manager) {
			out = append(out, mf.Manager)
		}
	}
	return out
}

func owns(fields map[string]any, path []string) bool {
	for _, p := range path {
		next, ok := fields[p].(map[string]any)
		if !ok {
			return false
		}
		fields = next
	}
	return true
}

// lifecyclePaths are the lifecycle fields (LifecycleFields) in managedFields notation.
var lifecyclePaths = [][]string{
	{"f:status", "f:phase"},
	{"f:status", "f:reason"},
	{"f:status", "f:phaseTransitionTimestamps"},
	{"f:status", "f:conditions", `k:{"type":"Ready"}`},
}

// HoldsLifecycle reports whether manager may write the VMI's lifecycle fields (LifecycleFields)
// without taking them over: it owns status.phase alone, or nobody does yet. Whoever owns the
// phase owns the other lifecycle fields with it.
func HoldsLifecycle(vmi *VirtualMachineInstance, manager string) bool {
	owners := FieldManagers(vmi, "f:status", "f:phase")
	return len(owners) == 0 || (len(owners) == 1 && owners[0] == manager)
}

// SharesLifecycle reports whether manager owns any of the VMI's lifecycle fields, alone or with
// others. Right after another writer took them over, the one before still owns those it had set
// to the same values (the Ready condition's type, say), until an apply of its own leaves them
// out.
func SharesLifecycle(vmi *VirtualMachineInstance, manager string) bool {
	for _, p := range lifecyclePaths {
		if slices.Contains(FieldManagers(vmi, p...), manager) {
			return true
		}
	}
	return false
}

// LifecycleFields returns the lifecycle fields of st, and nothing else of it: phase, reason,
// phaseTransitionTimestamps and the Ready condition. They say together where the VMI is in its
// life, and one writer at a time owns them all.
func LifecycleFields(st VirtualMachineInstanceStatus) VirtualMachineInstanceStatus {
	out := VirtualMachineInstanceStatus{
		Phase: st.Phase, Reason: st.Reason,
		PhaseTransitionTimestamps: slices.Clone(st.PhaseTransitionTimestamps),
	}
	if c := InstanceCondition(st.Conditions, VirtualMachineInstanceReady); c != nil {
		out.Conditions = []VirtualMachineInstanceCondition{*c}
	}
	return out
}

// StatusApply returns the body of a server-side apply of st as the status of vmi: its kind,
// name and namespace, resourceVersion when not empty (the API server then refuses the write,
// with a conflict, when the VMI changed since), and of st the fields that are set. A field a
// writer leaves empty is not in the body: the writer does not own it, and if it owned it alone
// before, the API server removes it.
func StatusApply(vmi *VirtualMachineInstance, st *VirtualMachineInstanceStatus, resourceVersion string) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encode VMI status: %w", err)
	}
	var status map[string]any
	if err := json.Unmarshal(b, &status); err != nil {
		return nil, fmt.Errorf("decode VMI status: %w", err)
	}
	meta := map[string]any{"name": vmi.Name, "namespace": vmi.Namespace}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	obj := map[string]any{
		"apiVersion": GroupVersion.String(),
		"kind":       "VirtualMachineInstance",
		"metadata":   meta,
	}
	if pruned, ok := prune(status).(map[string]any); ok {
		obj["status"] = pruned
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// prune drops what encoding a Go value writes for fields that are not set: nulls (an unset
// time), and objects and lists left empty once pruned (a zero struct). It returns nil for a
// value that is gone.
func prune(v any) any {
	switch v := v.(type) {
	case nil:
		return nil
	case map[string]any:
		for k, e := range v {
			if p := prune(e); p == nil {
				delete(v, k)
			} else {
				v[k] = p
			}
		}
		if len(v) == 0 {
			return nil
		}
	case []any:
		out := v[:0]
		for _, e := range v {
			if p := prune(e); p != nil {
				out = append(out, p)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return v
}

// IsFieldConflict reports whether err is the API server's refusal of a server-side apply that
// sets, without forcing, a field another field manager owns with another value. It is a
// conflict (apierrors.IsConflict) like a stale resourceVersion, which it is not: reading again
// does not resolve it.
func IsFieldConflict(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) || !apierrors.IsConflict(err) {
		return false
	}
	if d := se.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Type == metav1.CauseTypeFieldManagerConflict {
				return true
			}
		}
	}
	return false
}
