package envtest

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestStartServesTheCRDs starts the real API server and round-trips a VMI through it: the CRDs
// are installed, structural, and the typed client speaks to them.
func TestStartServesTheCRDs(t *testing.T) {
	env := Start(t, Options{})
	ctx := context.Background()
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"},
	}
	vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: resource.NewQuantity(64<<20, resource.BinarySI)}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("create VMI: %v", err)
	}
	var got v1alpha1.VirtualMachineInstance
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "probe"}, &got); err != nil {
		t.Fatalf("get VMI: %v", err)
	}
	if got.UID == "" || got.Spec.Domain.Memory == nil || got.Spec.Domain.Memory.Guest.Value() != 64<<20 {
		t.Fatalf("VMI read back = %+v", got.Spec.Domain)
	}
	var nodes corev1.NodeList
	if err := env.Client.List(ctx, &nodes); err != nil {
		t.Fatalf("list nodes (built-in types in the scheme): %v", err)
	}
}

func TestAssetsDirNamesTheMissingBinaries(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", t.TempDir())
	_, err := AssetsDir()
	if err == nil {
		t.Fatal("AssetsDir with an empty directory: no error")
	}
	for _, want := range []string{"kube-apiserver", "etcd", "make k8s-bins"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	t.Setenv("KUBEBUILDER_ASSETS", "relative/dir")
	if _, err := AssetsDir(); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("relative KUBEBUILDER_ASSETS: %v, want an error saying it must be absolute", err)
	}
}
