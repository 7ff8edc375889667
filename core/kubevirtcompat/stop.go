package kubevirtcompat

import (
	"reflect"
	"strings"
)

// StopOutside returns a stop function for TreeOf that makes every struct type outside the Go
// packages under modulePath opaque: Kubernetes' own types (corev1.Affinity, Toleration,
// ResourceList, ...) are then leaves, compared as a whole rather than field by field. Types of
// the module are looked into even when they have their own JSON decoding (KubeVirt's spec
// decodes itself for compatibility with older manifests; its fields are still JSON fields).
func StopOutside(modulePath string) func(reflect.Type) bool {
	return func(t reflect.Type) bool {
		p := t.PkgPath()
		return p != modulePath && !strings.HasPrefix(p, modulePath+"/")
	}
}
