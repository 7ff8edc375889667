package workloadupdate

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
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

// harness plays the VMI controller and the handler (VMIs Running with a launcher pod) and
// the disruption controller; the workload updater runs in a manager with only its markers'
// rights.
type harness struct {
	cfg *rest.Config // the updater's user, with its markers' rights
	c   client.Client
	ns  string
}

func (h *harness) start(t *testing.T, settings Settings) {
	t.Helper()
	h.startWith(t, Options{Settings: settings})
}

// startWith runs the updater with opts, its launcher image newImage.
func (h *harness) startWith(t *testing.T, opts Options) {
	t.Helper()
	opts.LauncherImage, opts.SkipNameValidation = newImage, true
	envtest.StartManager(t, h.cfg, func(mgr ctrl.Manager) error { return SetupWithManager(mgr, opts) })
}

// vmi creates a Running VMI with a Running, Ready launcher pod whose compute container runs
// image.
func (h *harness) vmi(t *testing.T, name, image string, migratable bool) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns}}
	if err := h.c.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "launcher-" + name, Namespace: h.ns, Labels: map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: layout.ComputeContainer, Image: image}}},
	}
	if err := h.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// Running and Ready: the eviction API ignores budgets for Pending pods.
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := h.c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	status := corev1.ConditionFalse
	if migratable {
		status = corev1.ConditionTrue
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err != nil {
			return err
		}
		cur.Status.Phase, cur.Status.NodeName, cur.Status.LauncherPodName = v1alpha1.Running, "node-1", pod.Name
		cur.Status.Conditions = []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: status}}
		return h.c.Status().Update(ctx, cur)
	}); err != nil {
		t.Fatal(err)
	}
	return vmi, pod
}

func (h *harness) marked(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) bool {
	t.Helper()
	cur := &v1alpha1.VirtualMachineInstance{}
	if err := h.c.Get(context.Background(), client.ObjectKeyFromObject(vmi), cur); err != nil {
		t.Fatal(err)
	}
	_, ok := cur.Labels[v1alpha1.OutdatedLauncherImageLabel]
	return ok
}

func (h *harness) migrations(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) []v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := h.c.List(context.Background(), &list, client.InNamespace(h.ns)); err != nil {
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

// evicted says whether pod is gone or being deleted.
func (h *harness) evicted(t *testing.T, pod *corev1.Pod) bool {
	t.Helper()
	cur := &corev1.Pod{}
	err := h.c.Get(context.Background(), client.ObjectKeyFromObject(pod), cur)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return cur.DeletionTimestamp != nil
}

// event waits for an event of reason about vmi and returns its note.
func (h *harness) event(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, reason string) string {
	t.Helper()
	var note string
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		events := &eventsv1.EventList{}
		if err := h.c.List(ctx, events, client.InNamespace(vmi.Namespace)); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			if e.Regarding.Name == vmi.Name && e.Regarding.Kind == "VirtualMachineInstance" {
				seen = append(seen, e.Reason)
				if e.Reason == reason {
					note = e.Note
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for a %s event about VMI %s: %v (seen %v)", reason, vmi.Name, err, seen)
	}
	return note
}

func (h *harness) namespace(t *testing.T, name string) {
	t.Helper()
	h.ns = name
	if err := h.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	// The updater decides over every namespace: the VMIs of a finished scenario go.
	t.Cleanup(func() {
		_ = h.c.DeleteAllOf(context.Background(), &v1alpha1.VirtualMachineInstance{}, client.InNamespace(name))
	})
}

// TestController runs the workload updater against a real API server, a scenario per
// strategy, each with its own manager.
func TestController(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	h := &harness{cfg: env.ImpersonateWithMarkers(t, "workload-updater", "controller.go"), c: env.Client}
	ctx := context.Background()

	t.Run("no methods: the outdated VMI is marked, nothing else, and unmarked on the new image", func(t *testing.T) {
		h.namespace(t, "mark-only")
		h.start(t, DefaultSettings())
		old, oldPod := h.vmi(t, "old", oldImage, true)
		cur, _ := h.vmi(t, "current", newImage, true)
		waitFor(t, "the outdated VMI marked", func() (bool, error) { return h.marked(t, old), nil })
		h.event(t, old, ReasonOutdatedLauncher)
		time.Sleep(consistent)
		if h.marked(t, cur) {
			t.Errorf("VMI on the current image marked")
		}
		if got := h.migrations(t, old); len(got) != 0 {
			t.Errorf("%d migrations without methods", len(got))
		}
		if h.evicted(t, oldPod) {
			t.Errorf("launcher pod evicted without methods")
		}
		// Its launcher now runs the current image (as after a migration): unmarked.
		envtest.Update(t, h.c, oldPod, func(p *corev1.Pod) { p.Spec.Containers[0].Image = newImage })
		waitFor(t, "the mark removed", func() (bool, error) { return !h.marked(t, old), nil })
		h.event(t, old, ReasonLauncherUpdated)
	})

	t.Run("LiveMigrate and Evict: migrate, evict, a refused eviction reported, the batch size honoured", func(t *testing.T) {
		h.namespace(t, "both")
		// Created before the updater runs, so that one decision sees them all.
		refused, refusedPod := h.vmi(t, "a-refused", oldImage, false)
		evicted, evictedPod := h.vmi(t, "b-evicted", oldImage, false)
		migrated, _ := h.vmi(t, "c-migrated", oldImage, true)
		later, laterPod := h.vmi(t, "d-later", oldImage, true)
		// A budget that allows no disruption of a-refused's launcher pod (playing the
		// disruption controller for its status).
		one := intstr.FromInt32(1)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "a-refused", Namespace: h.ns},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.CreatedByLabel: refusedPod.Labels[v1alpha1.CreatedByLabel]}}},
		}
		if err := h.c.Create(ctx, pdb); err != nil {
			t.Fatal(err)
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
			CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		if err := h.c.Status().Update(ctx, pdb); err != nil {
			t.Fatal(err)
		}
		h.start(t, Settings{
			Methods:   []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate, v1alpha1.WorkloadUpdateMethodEvict},
			BatchSize: 3, BatchInterval: time.Hour,
		})
		for _, v := range []*v1alpha1.VirtualMachineInstance{refused, evicted, migrated, later} {
			waitFor(t, v.Name+" marked", func() (bool, error) { return h.marked(t, v), nil })
		}
		waitFor(t, "a migration of the migratable VMI", func() (bool, error) { return len(h.migrations(t, migrated)) == 1, nil })
		m := h.migrations(t, migrated)[0]
		if !strings.HasPrefix(m.Name, MigrationGenerateName) || m.Labels[v1alpha1.WorkloadUpdateLabel] != "true" {
			t.Errorf("migration %s labels %v: want the updater's name and label", m.Name, m.Labels)
		}
		h.event(t, migrated, ReasonMigrationCreated)
		waitFor(t, "the eviction of the unmigratable VMI's launcher pod", func() (bool, error) { return h.evicted(t, evictedPod), nil })
		h.event(t, evicted, ReasonEvicted)
		if note := h.event(t, refused, ReasonFailed); !strings.Contains(note, "disruption budget") {
			t.Errorf("refused eviction's event %q: want the API server's reason", note)
		}
		if h.evicted(t, refusedPod) {
			t.Errorf("the budget's pod was evicted")
		}
		// The batch was 3: d-later waits for the next (in an hour).
		time.Sleep(consistent)
		if got := h.migrations(t, later); len(got) != 0 || h.evicted(t, laterPod) {
			t.Errorf("the fourth VMI was acted on in a batch of 3: %d migrations", len(got))
		}
		if got := h.migrations(t, migrated); len(got) != 1 {
			t.Errorf("%d migrations of the migrated VMI, want 1 while it is in flight", len(got))
		}
	})

	t.Run("batch interval: one per batch", func(t *testing.T) {
		h.namespace(t, "interval")
		first, _ := h.vmi(t, "first", oldImage, true)
		second, _ := h.vmi(t, "second", oldImage, true)
		h.start(t, Settings{Methods: []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate}, BatchSize: 1, BatchInterval: 3 * time.Second})
		waitFor(t, "the first migration", func() (bool, error) { return len(h.migrations(t, first)) == 1, nil })
		seen := time.Now()
		if got := h.migrations(t, second); len(got) != 0 {
			t.Fatalf("second VMI migrated in the first batch of 1")
		}
		waitFor(t, "the second migration", func() (bool, error) { return len(h.migrations(t, second)) == 1, nil })
		if gap := time.Since(seen); gap < 2*time.Second {
			t.Errorf("second batch %s after the first, want about the 3s interval", gap)
		}
	})

	t.Run("a rollout of the handler DaemonSet holds the batches; its end lets them act", func(t *testing.T) {
		h.namespace(t, "held")
		vmi, _ := h.vmi(t, "vm", oldImage, true)
		// The handler DaemonSet, half rolled out (playing the DaemonSet controller's status).
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "kubevisor-handler", Namespace: "kubevisor-system"},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "handler"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "handler"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "handler", Image: "handler:v2"}}},
				},
			},
		}
		if err := h.c.Create(ctx, ds); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.c.Delete(context.Background(), ds) })
		setStatus := func(updated, available int32) {
			t.Helper()
			ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 2,
				CurrentNumberScheduled: 2, UpdatedNumberScheduled: updated, NumberAvailable: available, NumberReady: available}
			if err := h.c.Status().Update(ctx, ds); err != nil {
				t.Fatal(err)
			}
		}
		setStatus(1, 1)
		h.startWith(t, Options{
			Settings:         Settings{Methods: []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate}, BatchSize: 1, BatchInterval: time.Second},
			HandlerDaemonSet: client.ObjectKeyFromObject(ds),
		})
		waitFor(t, "the outdated VMI marked while held", func() (bool, error) { return h.marked(t, vmi), nil })
		time.Sleep(consistent + HeldRecheck)
		if got := h.migrations(t, vmi); len(got) != 0 {
			t.Fatalf("%d migrations while the handler DaemonSet rolls out", len(got))
		}
		setStatus(2, 2)
		waitFor(t, "the migration once the handlers are rolled out", func() (bool, error) { return len(h.migrations(t, vmi)) == 1, nil })
	})
}
