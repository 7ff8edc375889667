package operator_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestKubevisorReplicasRules: the API server takes infra.replicas of 1 to 10 and refuses
// workloads.replicas (the node agent is a DaemonSet) and an infra.replicas out of range, each
// naming the field.
func TestKubevisorReplicasRules(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "operator", "crd", "kubevisor.io_kubevisors.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(data, &crd.Object); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &crd); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		return env.Client.List(ctx, &v1alpha1.KubevisorList{}) == nil, nil
	}); err != nil {
		t.Fatal("the Kubevisor CRD is not served")
	}
	for i, tc := range []struct {
		infra, workloads *int32
		refused          string // "" accepted, else what the refusal says
	}{
		{infra: ptr.To[int32](2)},
		{infra: ptr.To[int32](10)},
		{infra: ptr.To[int32](0), refused: "spec.infra.replicas"},
		{infra: ptr.To[int32](11), refused: "spec.infra.replicas"},
		{workloads: ptr.To[int32](2), refused: "workloads.replicas: the node agent is a DaemonSet"},
	} {
		kv := &v1alpha1.Kubevisor{ObjectMeta: metav1.ObjectMeta{Name: "kv" + string(rune('a'+i))}, Spec: v1alpha1.KubevisorSpec{Drivers: drivers("qmp")}}
		if tc.infra != nil {
			kv.Spec.Infra = &v1alpha1.ComponentPlacement{Replicas: tc.infra}
		}
		if tc.workloads != nil {
			kv.Spec.Workloads = &v1alpha1.ComponentPlacement{Replicas: tc.workloads}
		}
		err := env.Client.Create(ctx, kv)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("infra %v, workloads %v: refused: %v", ptrVal(tc.infra), ptrVal(tc.workloads), err)
		case tc.refused != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("infra %v, workloads %v: %v, want Invalid naming %q", ptrVal(tc.infra), ptrVal(tc.workloads), err, tc.refused)
		}
	}
}

func ptrVal(p *int32) any {
	if p == nil {
		return "unset"
	}
	return *p
}
