package migration_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestFinalizerBeforeTargetPod: a migration found without its finalizer (a write that failed
// earlier) has the finalizer written before its target pod is created, so that the pod never
// exists for a migration that can go without deleting it.
func TestFinalizerBeforeTargetPod(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns, UID: "vmi-uid"}}
	vmi.Status = v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: "node-a", LauncherPodName: "launcher",
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}},
	}
	source := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "launcher", Namespace: ns, Labels: map[string]string{v1alpha1.CreatedByLabel: "vmi-uid"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "compute", Image: "launcher"}}},
	}
	mig := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "mig", Namespace: ns, UID: "mig-uid"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"},
		Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationPending},
	}
	var calls []string
	c := fake.NewClientBuilder().WithScheme(envtest.Scheme()).
		WithObjects(vmi, source, mig).WithStatusSubresource(vmi, mig).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if _, ok := obj.(*corev1.Pod); ok {
					calls = append(calls, "create pod")
				}
				return c.Create(ctx, obj, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if m, ok := obj.(*v1alpha1.VirtualMachineInstanceMigration); ok && slices.Contains(m.Finalizers, migration.Finalizer) {
					calls = append(calls, "patch finalizer")
				}
				return c.Patch(ctx, obj, patch, opts...)
			},
		}).Build()
	r := &migration.Reconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(10)}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mig)}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"patch finalizer", "create pod"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
}
