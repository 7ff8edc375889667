package webhook

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestEvictionWebhook evicts pods through a real API server with manifests/webhook installed
// and kubevisor-api running with its generated role only: a launcher pod's eviction is answered
// by its VMI's eviction strategy.
func TestEvictionWebhook(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()

	// launcher creates a Running VMI with strategy (nil: unset) on node-1, LiveMigratable as
	// given, and its Running launcher pod.
	launcher := func(t *testing.T, name string, strategy *v1alpha1.EvictionStrategy, migratable corev1.ConditionStatus) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
		t.Helper()
		spec := minimalSpec()
		spec.EvictionStrategy = strategy
		v := vmi(name, spec)
		if err := c.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		cond := v1alpha1.VirtualMachineInstanceCondition{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: migratable}
		if migratable != corev1.ConditionTrue {
			cond.Reason, cond.Message = v1alpha1.ReasonInterfaceNotLiveMigratable, "interface default: bridge binding on the pod network"
		}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(v), v); err != nil {
				return err
			}
			v.Status = v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Running, NodeName: "node-1",
				LauncherPodName: "launcher-" + name, Conditions: []v1alpha1.VirtualMachineInstanceCondition{cond}}
			return c.Status().Update(ctx, v)
		}); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "launcher-" + name, Namespace: "vms", Labels: map[string]string{
				v1alpha1.CreatedByLabel: string(v.UID), v1alpha1.VirtualMachineInstanceNameLabel: name}},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "compute", Image: "none"}}},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return v, p
	}
	evict := func(p *corev1.Pod, opts ...client.SubResourceCreateOption) error {
		return c.SubResource("eviction").Create(ctx, p, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}, opts...)
	}
	mark := func(t *testing.T, v *v1alpha1.VirtualMachineInstance) (string, []string) {
		t.Helper()
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(v), cur); err != nil {
			t.Fatal(err)
		}
		return cur.Status.EvacuationNodeName, v1alpha1.FieldManagers(cur, "f:status", "f:evacuationNodeName")
	}
	refused := func(t *testing.T, err error, words ...string) {
		t.Helper()
		var st apierrors.APIStatus
		if !apierrors.IsTooManyRequests(err) || !errors.As(err, &st) || st.Status().Code != http.StatusTooManyRequests {
			t.Fatalf("eviction: %v, want 429 TooManyRequests", err)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal %q lacks %q", err.Error(), w)
			}
		}
	}

	t.Run("LiveMigrate: marked and refused, again on retry", func(t *testing.T) {
		v, p := launcher(t, "lm", ptr.To(v1alpha1.EvictionStrategyLiveMigrate), corev1.ConditionTrue)
		refused(t, evict(p), "vms/lm", "being live-migrated", "node-1")
		node, owners := mark(t, v)
		if node != "node-1" || len(owners) != 1 || owners[0] != v1alpha1.EvacuationFieldManager {
			t.Errorf("evacuationNodeName %q owned by %v, want node-1 by %s", node, owners, v1alpha1.EvacuationFieldManager)
		}
		refused(t, evict(p), "being live-migrated")
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil || p.DeletionTimestamp != nil {
			t.Errorf("launcher pod after refused evictions: %v, deleting %v", err, p.DeletionTimestamp)
		}
	})

	t.Run("dry run: refused, not marked", func(t *testing.T) {
		v, p := launcher(t, "dry", ptr.To(v1alpha1.EvictionStrategyLiveMigrate), corev1.ConditionTrue)
		refused(t, evict(p, client.DryRunAll), "being live-migrated")
		if node, _ := mark(t, v); node != "" {
			t.Errorf("a dry run marked the VMI for %q", node)
		}
	})

	t.Run("not LiveMigratable: refused with the reason, not marked", func(t *testing.T) {
		v, p := launcher(t, "bridge", ptr.To(v1alpha1.EvictionStrategyLiveMigrate), corev1.ConditionFalse)
		refused(t, evict(p), "cannot be migrated", v1alpha1.ReasonInterfaceNotLiveMigratable, "bridge binding")
		if node, _ := mark(t, v); node != "" {
			t.Errorf("a VMI that cannot migrate was marked for %q", node)
		}
	})

	t.Run("strategy unset (default None): the eviction proceeds", func(t *testing.T) {
		v, p := launcher(t, "plain", nil, corev1.ConditionTrue)
		if err := evict(p); err != nil {
			t.Fatalf("eviction: %v", err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err == nil && p.DeletionTimestamp == nil {
			t.Error("launcher pod neither gone nor being deleted after its eviction")
		}
		if node, _ := mark(t, v); node != "" {
			t.Errorf("VMI marked for %q", node)
		}
	})

	t.Run("another pod: the eviction proceeds", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "vms"},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "web", Image: "none"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := evict(p); err != nil {
			t.Fatalf("eviction: %v", err)
		}
	})
}
