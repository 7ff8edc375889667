package workloadupdate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

const (
	oldImage = "kubevisor/kubevisor-launcher:v1"
	newImage = "kubevisor/kubevisor-launcher:v2"
)

var now = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

type opt func(*Workload)

// workload is a Running VMI named name with its launcher pod running image.
func workload(name, image string, opts ...opt) Workload {
	uid := types.UID("uid-" + name)
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Status: v1alpha1.VirtualMachineInstanceStatus{
			Phase: v1alpha1.Running, LauncherPodName: "launcher-" + name, NodeName: "node1",
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "launcher-" + name, Namespace: "default", Labels: map[string]string{v1alpha1.CreatedByLabel: string(uid)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: layout.ComputeContainer, Image: image}}},
	}
	w := Workload{VMI: vmi, Pod: pod}
	for _, o := range opts {
		o(&w)
	}
	return w
}

func migratable(w *Workload) {
	w.VMI.Status.Conditions = append(w.VMI.Status.Conditions, v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue})
}

func marked(w *Workload) { w.VMI.Labels = map[string]string{v1alpha1.OutdatedLauncherImageLabel: ""} }

func phase(p v1alpha1.VirtualMachineInstancePhase) opt {
	return func(w *Workload) { w.VMI.Status.Phase = p }
}

func migration(name string, p v1alpha1.VirtualMachineInstanceMigrationPhase, ours bool, created time.Time) opt {
	return func(w *Workload) {
		m := v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: metav1.NewTime(created)},
			Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: w.VMI.Name},
			Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: p},
		}
		if ours {
			m.Labels = map[string]string{v1alpha1.WorkloadUpdateLabel: "true"}
		}
		if p == v1alpha1.MigrationFailed {
			m.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
				{Phase: p, PhaseTransitionTimestamp: metav1.NewTime(created.Add(time.Minute))}}
		}
		w.Migrations = append(w.Migrations, m)
	}
}

func names(vmis []*v1alpha1.VirtualMachineInstance) string {
	var s []string
	for _, v := range vmis {
		s = append(s, v.Name)
	}
	return strings.Join(s, ",")
}

func batch(as []Action) string {
	var s []string
	for _, a := range as {
		s = append(s, string(a.Method)+":"+a.VMI.Name)
	}
	return strings.Join(s, ",")
}

var (
	live  = []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate}
	evict = []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodEvict}
	both  = []v1alpha1.WorkloadUpdateMethod{v1alpha1.WorkloadUpdateMethodLiveMigrate, v1alpha1.WorkloadUpdateMethodEvict}
)

func TestDecide(t *testing.T) {
	for _, c := range []struct {
		name      string
		methods   []v1alpha1.WorkloadUpdateMethod
		size      int
		lastBatch time.Time
		held      string
		workloads []Workload
		// want: marked, unmarked, batch, outdated, left, wait
		mark, unmark, batch string
		outdated, left      int
		wait                time.Duration
	}{
		{name: "current image: nothing", methods: both,
			workloads: []Workload{workload("a", newImage, migratable)}},
		{name: "outdated, no methods: marked only", outdated: 1, mark: "a",
			workloads: []Workload{workload("a", oldImage, migratable)}},
		{name: "outdated and marked, no methods: nothing", outdated: 1,
			workloads: []Workload{workload("a", oldImage, migratable, marked)}},
		{name: "outdated migratable, LiveMigrate: a migration", methods: live, outdated: 1, mark: "a", batch: "LiveMigrate:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable)}},
		{name: "outdated not migratable, LiveMigrate only: marked only", methods: live, outdated: 1, mark: "a",
			workloads: []Workload{workload("a", oldImage)}},
		{name: "outdated not migratable, both: evicted", methods: both, outdated: 1, mark: "a", batch: "Evict:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage)}},
		{name: "outdated migratable, Evict only: evicted", methods: evict, outdated: 1, mark: "a", batch: "Evict:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable)}},
		{name: "both: migrate the migratable, evict the others", methods: both, outdated: 2, mark: "b,a", batch: "LiveMigrate:a,Evict:b", wait: time.Minute,
			workloads: []Workload{workload("b", oldImage), workload("a", oldImage, migratable)}},
		{name: "marked VMI on the current image: unmarked", methods: both, unmark: "a",
			workloads: []Workload{workload("a", newImage, marked)}},
		{name: "marked VMI that finished: unmarked", methods: both, unmark: "a",
			workloads: []Workload{workload("a", oldImage, marked, phase(v1alpha1.Succeeded))}},
		{name: "marked VMI not running yet: kept", methods: both,
			workloads: []Workload{workload("a", oldImage, marked, phase(v1alpha1.Scheduled))}},
		{name: "launcher pod not found: left as it is", methods: both,
			workloads: []Workload{workload("a", oldImage, marked, func(w *Workload) { w.Pod = nil })}},
		{name: "a pod of another VMI of the name: left as it is", methods: both,
			workloads: []Workload{workload("a", oldImage, func(w *Workload) { w.Pod.Labels[v1alpha1.CreatedByLabel] = "other" })}},
		{name: "a VMI being deleted: left as it is", methods: both,
			workloads: []Workload{workload("a", oldImage, func(w *Workload) { w.VMI.DeletionTimestamp = &metav1.Time{Time: now} })}},
		{name: "a migration in flight: no other", methods: both, outdated: 1,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationRunning, true, now.Add(-time.Minute)))}},
		{name: "someone else's migration in flight: none", methods: both, outdated: 1,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationPending, false, now.Add(-time.Minute)))}},
		{name: "a completed migration not yet switched to its target: none", methods: both, outdated: 1,
			workloads: []Workload{workload("a", oldImage, migratable, marked, func(w *Workload) {
				w.VMI.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{Completed: true, TargetPod: "target-a"}
			})}},
		{name: "being evacuated: none", methods: both, outdated: 1,
			workloads: []Workload{workload("a", oldImage, marked, func(w *Workload) { w.VMI.Status.EvacuationNodeName = "node1" })}},
		{name: "launcher pod being deleted (evicted): none", methods: both, outdated: 1,
			workloads: []Workload{workload("a", oldImage, marked, func(w *Workload) { w.Pod.DeletionTimestamp = &metav1.Time{Time: now} })}},
		{name: "a succeeded migration of an earlier image does not hold", methods: both, outdated: 1, batch: "LiveMigrate:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationSucceeded, true, now.Add(-time.Hour)))}},
		{name: "our migration failed recently: backoff", methods: both, outdated: 1, left: 1, wait: 2 * time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationFailed, true, now.Add(-4*time.Minute)))}},
		{name: "our migration failed long ago: another", methods: both, outdated: 1, batch: "LiveMigrate:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationFailed, true, now.Add(-time.Hour)))}},
		{name: "batch size: the first by name, the rest left", methods: evict, size: 2, outdated: 3, mark: "c,a,b", batch: "Evict:a,Evict:b", left: 1, wait: time.Minute,
			workloads: []Workload{workload("c", oldImage), workload("a", oldImage), workload("b", oldImage)}},
		{name: "within the interval: marked, no batch", methods: evict, lastBatch: now.Add(-20 * time.Second), outdated: 1, mark: "a", left: 1, wait: 40 * time.Second,
			workloads: []Workload{workload("a", oldImage)}},
		{name: "the interval passed: a batch", methods: evict, lastBatch: now.Add(-time.Minute), outdated: 1, batch: "Evict:a", wait: time.Minute,
			workloads: []Workload{workload("a", oldImage, marked)}},
		{name: "within the interval and nothing to do: no wait", methods: evict, lastBatch: now.Add(-20 * time.Second),
			workloads: []Workload{workload("a", newImage)}},
		{name: "held (handlers rolling out): marked, no batch, looked at again soon", methods: both, held: "rollout", outdated: 2, mark: "a,b", left: 2, wait: HeldRecheck,
			workloads: []Workload{workload("a", oldImage, migratable), workload("b", oldImage)}},
		{name: "held and nothing to act on: no wait", methods: both, held: "rollout", outdated: 1,
			workloads: []Workload{workload("a", oldImage, marked, func(w *Workload) { w.VMI.Status.EvacuationNodeName = "node1" })}},
		{name: "held, a VMI in its backoff alone: looked at again when it ends", methods: both, held: "rollout", outdated: 1, left: 1, wait: 2 * time.Minute,
			workloads: []Workload{workload("a", oldImage, migratable, marked, migration("m1", v1alpha1.MigrationFailed, true, now.Add(-4*time.Minute)))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(Observation{
				LauncherImage: newImage, Settings: Settings{Methods: c.methods, BatchSize: c.size},
				Workloads: c.workloads, LastBatch: c.lastBatch, Now: now, Held: c.held,
			})
			got := fmt.Sprintf("mark=%s unmark=%s batch=%s outdated=%d left=%d wait=%s", names(d.Mark), names(d.Unmark), batch(d.Batch), d.Outdated, d.Left, d.Wait)
			want := fmt.Sprintf("mark=%s unmark=%s batch=%s outdated=%d left=%d wait=%s", c.mark, c.unmark, c.batch, c.outdated, c.left, c.wait)
			if got != want {
				t.Errorf("\n got %s\nwant %s", got, want)
			}
			if wantHeld := c.held != "" && c.wait == HeldRecheck; (d.Held != "") != wantHeld {
				t.Errorf("Held %q, want it set: %v", d.Held, wantHeld)
			}
			for _, a := range d.Batch {
				if a.Method == v1alpha1.WorkloadUpdateMethodEvict && a.Pod == nil {
					t.Errorf("eviction of %s without its pod", a.VMI.Name)
				}
			}
		})
	}
}

func TestParseMethods(t *testing.T) {
	for in, want := range map[string]string{"": "", "LiveMigrate": "LiveMigrate", "LiveMigrate,Evict": "LiveMigrate,Evict", "Evict, Evict": "Evict"} {
		got, err := ParseMethods(in)
		if err != nil {
			t.Errorf("ParseMethods(%q): %v", in, err)
			continue
		}
		var s []string
		for _, m := range got {
			s = append(s, string(m))
		}
		if strings.Join(s, ",") != want {
			t.Errorf("ParseMethods(%q) = %v, want %s", in, s, want)
		}
	}
	if _, err := ParseMethods("LiveMigrate,Restart"); err == nil || !strings.Contains(err.Error(), `"Restart"`) {
		t.Errorf("ParseMethods of Restart: %v, want an error naming it", err)
	}
}

func TestSettingsValidate(t *testing.T) {
	if err := DefaultSettings().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for _, s := range []Settings{
		{Methods: []v1alpha1.WorkloadUpdateMethod{"Restart"}},
		{BatchSize: -1},
		{BatchInterval: time.Millisecond},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("Validate(%+v): nil, want an error", s)
		}
	}
}
