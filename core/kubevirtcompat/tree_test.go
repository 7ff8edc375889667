package kubevirtcompat

import (
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

type treeEmpty struct{}

type treeInline struct {
	Bridge *treeEmpty `json:"bridge,omitempty"`
}

type treeRecursive struct {
	Name string         `json:"name"`
	Next *treeRecursive `json:"next,omitempty"`
}

type treeSample struct {
	Name       string `json:"name"`
	Skipped    string `json:"-"`
	unexported string
	Items      []treeItem          `json:"items,omitempty"`
	Tags       []string            `json:"tags,omitempty"`
	Empties    []treeEmpty         `json:"empties,omitempty"`
	Labels     map[string]treeItem `json:"labels,omitempty"`
	Size       *resource.Quantity  `json:"size,omitempty"`
	Affinity   *corev1.Affinity    `json:"affinity,omitempty"`
	Chain      treeRecursive       `json:"chain"`
	Raw        []byte              `json:"raw,omitempty"`
	treeInline `json:",inline"`
}

type treeItem struct {
	Slirp *treeEmpty `json:"slirp,omitempty"`
	Port  int32      `json:"port"`
}

func TestTreeOfLeaves(t *testing.T) {
	_ = treeSample{}.unexported
	got := TreeOf(reflect.TypeFor[treeSample](), StopOutside(KubevisorModule)).Leaves()
	want := []string{
		"affinity", "bridge", "chain.name", "chain.next", "empties[]", "items[].port", "items[].slirp",
		"labels", "name", "raw", "size", "tags",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("leaves\n got %v\nwant %v", got, want)
	}
	// Without a stop at other modules, Kubernetes' types are looked into, but a Quantity (its
	// own JSON) still is not.
	full := TreeOf(reflect.TypeFor[treeSample](), nil)
	if !full.Has("affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[].key") {
		t.Error("the full tree does not look into corev1.Affinity")
	}
	if n := full.Lookup("size"); n == nil || !n.Opaque() {
		t.Errorf("size = %+v, want an opaque leaf", n)
	}
	// The tree built from its leaves knows the same paths.
	back := TreeFromLeaves(got)
	if l := back.Leaves(); !slices.Equal(l, want) {
		t.Fatalf("TreeFromLeaves(...).Leaves() = %v", l)
	}
	for _, p := range []string{"items[]", "items", "items[].slirp", "chain", "empties[]"} {
		if !back.Has(p) {
			t.Errorf("Has(%q) = false", p)
		}
	}
	for _, p := range []string{"items.slirp", "items[].bogus", "name.x", "chain[]"} {
		if back.Has(p) {
			t.Errorf("Has(%q) = true", p)
		}
	}
}
