package evacuation

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// Generous: the machines that run these share two cores with compilers.
const (
	eventually = 60 * time.Second
	consistent = 3 * time.Second
	poll       = 100 * time.Millisecond
)

func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(context.Context) (bool, error) { return cond() }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// setStatus plays the VMI controller and the handler: it changes the VMI's status by update.
func setStatus(t *testing.T, c client.Client, vmi *v1alpha1.VirtualMachineInstance, mutate func(*v1alpha1.VirtualMachineInstanceStatus)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(vmi), cur); err != nil {
			return err
		}
		mutate(&cur.Status)
		return c.Status().Update(context.Background(), cur)
	}); err != nil {
		t.Fatal(err)
	}
}

func migrationsOf(t *testing.T, c client.Client, vmi *v1alpha1.VirtualMachineInstance) []v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := c.List(context.Background(), &list, client.InNamespace(vmi.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []v1alpha1.VirtualMachineInstanceMigration
	for _, m := range list.Items {
		if m.Spec.VMIName == vmi.Name {
			out = append(out, m)
		}
	}
	return out
}

// TestController runs the evacuation controller in a manager with only its RBAC markers'
// rights against a real API server; the test plays the webhook (Mark), the VMI controller,
// the migration controller and the disruption controller.
func TestController(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	cfg := env.ImpersonateWithMarkers(t, "evacuation-controller", "controller.go")
	envtest.StartManager(t, cfg, func(mgr ctrl.Manager) error {
		return SetupWithManager(mgr, Options{SkipNameValidation: true, RetryBackoff: time.Second, MaxRetryBackoff: 2 * time.Second})
	})
	c := env.Client
	ctx := context.Background()

	newVMI := func(t *testing.T, name string, strategy *v1alpha1.EvictionStrategy) *v1alpha1.VirtualMachineInstance {
		t.Helper()
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		vmi.Spec.EvictionStrategy = strategy
		if err := c.Create(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		setStatus(t, c, vmi, func(st *v1alpha1.VirtualMachineInstanceStatus) {
			st.Phase, st.NodeName, st.LauncherPodName = v1alpha1.Running, "node-1", "launcher-"+name
			st.Conditions = []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}}
		})
		return vmi
	}
	// runningPod creates a pod and makes it Running and Ready: the eviction API ignores budgets
	// for Pending pods, and lets an unready pod go while the budget is healthy.
	runningPod := func(t *testing.T, name string, labels map[string]string) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	getPDB := func(vmi *v1alpha1.VirtualMachineInstance) (*policyv1.PodDisruptionBudget, error) {
		pdb := &policyv1.PodDisruptionBudget{}
		return pdb, c.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: PDBName(vmi)}, pdb)
	}

	t.Run("LiveMigrate: budget, one migration per mark, unmarked once moved", func(t *testing.T) {
		vmi := newVMI(t, "lm", ptr.To(v1alpha1.EvictionStrategyLiveMigrate))
		var pdb *policyv1.PodDisruptionBudget
		waitFor(t, "the PodDisruptionBudget", func() (bool, error) {
			var err error
			pdb, err = getPDB(vmi)
			return err == nil, client.IgnoreNotFound(err)
		})
		if !metav1.IsControlledBy(pdb, vmi) || pdb.Spec.MinAvailable.IntValue() != 1 ||
			pdb.Spec.Selector.MatchLabels[v1alpha1.CreatedByLabel] != string(vmi.UID) {
			t.Errorf("PodDisruptionBudget = %+v", pdb)
		}
		if got := migrationsOf(t, c, vmi); len(got) != 0 {
			t.Fatalf("migrations before any mark: %d", len(got))
		}

		// The webhook marks the VMI: exactly one migration, however long we look.
		if err := Mark(ctx, c, vmi, "node-1"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a migration", func() (bool, error) { return len(migrationsOf(t, c, vmi)) > 0, nil })
		time.Sleep(consistent)
		got := migrationsOf(t, c, vmi)
		if len(got) != 1 {
			t.Fatalf("%d migrations of a marked VMI, want 1", len(got))
		}
		m := got[0]
		if !strings.HasPrefix(m.Name, "lm-evacuation-") || m.Labels[v1alpha1.EvacuationLabel] != "node-1" {
			t.Errorf("migration %s labels %v", m.Name, m.Labels)
		}

		// It fails: after the backoff (1 s) a second one, and only one.
		m.Status.Phase = v1alpha1.MigrationFailed
		m.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{{Phase: v1alpha1.MigrationFailed, PhaseTransitionTimestamp: metav1.Now()}}
		if err := c.Status().Update(ctx, &m); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a second migration after the failure", func() (bool, error) { return len(migrationsOf(t, c, vmi)) == 2, nil })
		time.Sleep(consistent)
		got = migrationsOf(t, c, vmi)
		if len(got) != 2 {
			t.Fatalf("%d migrations after one failure, want 2", len(got))
		}

		// It succeeds, as the VMI's migration state says, before the VMI controller moves the
		// VMI to its target: no further migration meanwhile.
		for i := range got {
			if got[i].Name != m.Name {
				setStatus(t, c, vmi, func(st *v1alpha1.VirtualMachineInstanceStatus) {
					st.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: got[i].UID, SourceNode: "node-1", TargetNode: "node-2", Completed: true}
				})
				got[i].Status.Phase = v1alpha1.MigrationSucceeded
				// As the migration controller writes it: the nodes it moved the VMI between.
				got[i].Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2", Completed: true}
				if err := c.Status().Update(ctx, &got[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(consistent)
		if got := migrationsOf(t, c, vmi); len(got) != 2 {
			t.Fatalf("%d migrations once one succeeded, the VMI not moved yet, want 2", len(got))
		}
		// The VMI moves: the mark goes, no further migration.
		setStatus(t, c, vmi, func(st *v1alpha1.VirtualMachineInstanceStatus) {
			st.NodeName, st.LauncherPodName = "node-2", "launcher-lm-target"
		})
		waitFor(t, "the mark removed", func() (bool, error) {
			cur := &v1alpha1.VirtualMachineInstance{}
			err := c.Get(ctx, client.ObjectKeyFromObject(vmi), cur)
			return err == nil && cur.Status.EvacuationNodeName == "", err
		})
		time.Sleep(consistent)
		if got := migrationsOf(t, c, vmi); len(got) != 2 {
			t.Errorf("%d migrations after the VMI moved, want 2", len(got))
		}

		// The strategy changes to None: the budget goes.
		envtest.Update(t, c, vmi, func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyNone)
		})
		waitFor(t, "the budget removed", func() (bool, error) {
			_, err := getPDB(vmi)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
	})

	t.Run("the budget refuses an eviction that bypasses the webhook", func(t *testing.T) {
		vmi := newVMI(t, "pdb", ptr.To(v1alpha1.EvictionStrategyLiveMigrate))
		var pdb *policyv1.PodDisruptionBudget
		waitFor(t, "the PodDisruptionBudget", func() (bool, error) {
			var err error
			pdb, err = getPDB(vmi)
			return err == nil, client.IgnoreNotFound(err)
		})
		launcher := runningPod(t, "launcher-pdb", map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID)})
		other := runningPod(t, "other", map[string]string{"app": "other"})
		// No kube-controller-manager here: play its disruption controller, which counts the
		// one healthy launcher pod against minAvailable 1.
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
			CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		if err := c.Status().Update(ctx, pdb); err != nil {
			t.Fatal(err)
		}
		evict := func(p *corev1.Pod) error {
			return c.SubResource("eviction").Create(ctx, p, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
		}
		err := evict(launcher)
		if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
			t.Errorf("eviction of the launcher pod: %v, want 429 for its disruption budget", err)
		}
		if err := evict(other); err != nil {
			t.Errorf("eviction of a pod the budget does not select: %v", err)
		}

		// The VMI finishes: the budget goes, and the pod may be evicted.
		setStatus(t, c, vmi, func(st *v1alpha1.VirtualMachineInstanceStatus) { st.Phase = v1alpha1.Succeeded })
		waitFor(t, "the budget removed with the VMI finished", func() (bool, error) {
			_, err := getPDB(vmi)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err := evict(launcher); err != nil {
			t.Errorf("eviction once the budget is gone: %v", err)
		}
	})

	t.Run("during a migration the budget holds both pods: minAvailable 2, back to 1 after", func(t *testing.T) {
		vmi := newVMI(t, "moving", ptr.To(v1alpha1.EvictionStrategyLiveMigrate))
		minAvailable := func(want int) *policyv1.PodDisruptionBudget {
			t.Helper()
			var pdb *policyv1.PodDisruptionBudget
			waitFor(t, fmt.Sprintf("the budget at minAvailable %d", want), func() (bool, error) {
				var err error
				pdb, err = getPDB(vmi)
				return err == nil && pdb.Spec.MinAvailable.IntValue() == want, client.IgnoreNotFound(err)
			})
			return pdb
		}
		minAvailable(1)
		// A user's migration (no mark): its target pod will carry the VMI's created-by label.
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "moving-mig", Namespace: "default"},
			Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		pdb := minAvailable(2)
		// Source and target pod both running and ready, as the disruption controller then
		// counts them: at 2 no eviction is allowed, so an eviction of the source pod that does
		// not reach the webhook (failurePolicy Ignore) is refused by the budget.
		mine := map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID)}
		source := runningPod(t, "launcher-moving", mine)
		runningPod(t, "launcher-moving-target", mine)
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
			CurrentHealthy: 2, DesiredHealthy: 2, ExpectedPods: 2}
		if err := c.Status().Update(ctx, pdb); err != nil {
			t.Fatal(err)
		}
		err := c.SubResource("eviction").Create(ctx, source, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: source.Name, Namespace: source.Namespace}})
		if !apierrors.IsTooManyRequests(err) {
			t.Errorf("eviction of the migration's source pod: %v, want 429 for the budget", err)
		}

		m.Status.Phase = v1alpha1.MigrationSucceeded
		if err := c.Status().Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		minAvailable(1)
	})

	t.Run("strategy None: no budget, a mark makes no migration and is removed", func(t *testing.T) {
		vmi := newVMI(t, "none", nil)
		if err := Mark(ctx, c, vmi, "node-0"); err != nil {
			t.Fatal(err)
		}
		// node-0 is not where it runs: unmarked.
		waitFor(t, "the stale mark removed", func() (bool, error) {
			cur := &v1alpha1.VirtualMachineInstance{}
			err := c.Get(ctx, client.ObjectKeyFromObject(vmi), cur)
			return err == nil && cur.Status.EvacuationNodeName == "", err
		})
		time.Sleep(consistent)
		if _, err := getPDB(vmi); !apierrors.IsNotFound(err) {
			t.Errorf("budget of a VMI with strategy None: %v", err)
		}
		if got := migrationsOf(t, c, vmi); len(got) != 0 {
			t.Errorf("%d migrations of a VMI with strategy None", len(got))
		}
	})

	t.Run("the mark has one owner", func(t *testing.T) {
		vmi := newVMI(t, "owner", ptr.To(v1alpha1.EvictionStrategyExternal))
		if err := Mark(ctx, c, vmi, "node-1"); err != nil {
			t.Fatal(err)
		}
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err != nil {
			t.Fatal(err)
		}
		if owners := v1alpha1.FieldManagers(cur, "f:status", "f:evacuationNodeName"); fmt.Sprint(owners) != "["+v1alpha1.EvacuationFieldManager+"]" {
			t.Errorf("evacuationNodeName owners = %v", owners)
		}
		// External: the mark stays, and no migration is made.
		time.Sleep(consistent)
		if got := migrationsOf(t, c, vmi); len(got) != 0 {
			t.Errorf("%d migrations for External", len(got))
		}
	})
}
