package operator

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestRenderWorkloadUpdate: the strategy becomes kubevisor-controller's flags; unset, none.
func TestRenderWorkloadUpdate(t *testing.T) {
	plain := containerOf(t, find(mustRender(t, specOf("qmp", "cni", "local")), "Deployment", ControllerDeployment), "controller")
	if slices.ContainsFunc(plain.Args, func(a string) bool { return strings.HasPrefix(a, "--workload-update-") }) {
		t.Errorf("controller args %q without a strategy: want no workload update flag", plain.Args)
	}
	spec := specOf("qmp", "cni", "local")
	spec.WorkloadUpdateStrategy = &v1alpha1.WorkloadUpdateStrategy{
		WorkloadUpdateMethods: []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate, v1alpha1.WorkloadUpdateMethodEvict},
		BatchEvictionSize:     ptr.To(5),
		BatchEvictionInterval: &metav1.Duration{Duration: 30 * time.Second},
	}
	ctl := containerOf(t, find(mustRender(t, spec), "Deployment", ControllerDeployment), "controller")
	for _, want := range []string{"--workload-update-methods=LiveMigrate,Evict", "--workload-update-batch-size=5", "--workload-update-batch-interval=30s"} {
		if !slices.Contains(ctl.Args, want) {
			t.Errorf("controller args %q lack %s", ctl.Args, want)
		}
	}
	// An empty list is the default: mark only, no flag.
	spec.WorkloadUpdateStrategy = &v1alpha1.WorkloadUpdateStrategy{}
	ctl = containerOf(t, find(mustRender(t, spec), "Deployment", ControllerDeployment), "controller")
	if slices.ContainsFunc(ctl.Args, func(a string) bool { return strings.HasPrefix(a, "--workload-update-") }) {
		t.Errorf("controller args %q with an empty strategy: want no workload update flag", ctl.Args)
	}
}

func TestRenderRefusesBadWorkloadUpdate(t *testing.T) {
	for _, c := range []struct {
		name string
		s    v1alpha1.WorkloadUpdateStrategy
		want string
	}{
		{"unknown method", v1alpha1.WorkloadUpdateStrategy{WorkloadUpdateMethods: []v1alpha1.WorkloadUpdateMethod{"LiveMigrate", "Restart"}},
			`spec.workloadUpdateStrategy.workloadUpdateMethods[1]: Unsupported value: "Restart": supported values: "LiveMigrate", "Evict"`},
		{"a method twice", v1alpha1.WorkloadUpdateStrategy{WorkloadUpdateMethods: []v1alpha1.WorkloadUpdateMethod{"Evict", "Evict"}},
			`spec.workloadUpdateStrategy.workloadUpdateMethods[1]: Duplicate value: "Evict"`},
		{"batch of 0", v1alpha1.WorkloadUpdateStrategy{BatchEvictionSize: ptr.To(0)},
			"spec.workloadUpdateStrategy.batchEvictionSize: Invalid value: 0: at least 1"},
		{"interval under 1s", v1alpha1.WorkloadUpdateStrategy{BatchEvictionInterval: &metav1.Duration{Duration: 500 * time.Millisecond}},
			`spec.workloadUpdateStrategy.batchEvictionInterval: Invalid value: "500ms": at least 1s`},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := specOf("qmp", "cni", "local")
			spec.WorkloadUpdateStrategy = &c.s
			r, errs := testRenderer.Render(spec)
			if len(errs) == 0 {
				t.Fatalf("rendered %d objects, want an error", len(r.Objects))
			}
			if got := errs.ToAggregate().Error(); !strings.Contains(got, c.want) {
				t.Errorf("error %q, want it to hold %q", got, c.want)
			}
		})
	}
}

// TestCountOutdated: the active Kubevisor's status counts the VMIs the workload updater
// marked.
func TestCountOutdated(t *testing.T) {
	ctx := context.Background()
	vmi := func(name string, marked bool) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		if marked {
			v.Labels = map[string]string{v1alpha1.OutdatedLauncherImageLabel: ""}
		}
		return v
	}
	kv := &v1alpha1.Kubevisor{ObjectMeta: metav1.ObjectMeta{Name: "kubevisor"}}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithStatusSubresource(kv).
		WithObjects(kv, vmi("a", true), vmi("b", false), vmi("c", true)).Build()
	r := &Reconciler{Client: c, Reader: c}
	outdated := func() *int {
		t.Helper()
		cur := &v1alpha1.Kubevisor{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(kv), cur); err != nil {
			t.Fatal(err)
		}
		return cur.Status.OutdatedVirtualMachineInstanceWorkloads
	}
	if err := r.countOutdated(ctx); err != nil {
		t.Fatal(err)
	}
	if n := outdated(); n == nil || *n != 2 {
		t.Errorf("outdated = %v, want 2", n)
	}
	for _, name := range []string{"a", "c"} {
		unmarked := vmi(name, false)
		if err := c.Patch(ctx, unmarked, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"`+v1alpha1.OutdatedLauncherImageLabel+`":null}}}`))); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.countOutdated(ctx); err != nil {
		t.Fatal(err)
	}
	if n := outdated(); n == nil || *n != 0 {
		t.Errorf("outdated = %v, want 0", n)
	}
}
