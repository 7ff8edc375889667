package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func vmi(uid string, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid), CreationTimestamp: metav1.NewTime(t0)},
		Status:     v1alpha1.VirtualMachineInstanceStatus{Phase: phase},
	}
}

func TestTracker(t *testing.T) {
	var got []float64
	now := t0.Add(7 * time.Second)
	tr := newTracker(func(v float64) { got = append(got, v) }, func() time.Time { return now })

	tr.add(vmi("a", v1alpha1.Pending), false)
	tr.update(vmi("a", v1alpha1.Scheduled))
	if len(got) != 0 {
		t.Fatalf("observed %v before Running", got)
	}
	tr.update(vmi("a", v1alpha1.Running))
	tr.update(vmi("a", v1alpha1.Running)) // a later status change of the same VMI
	if len(got) != 1 || got[0] != 7 {
		t.Fatalf("observed %v, want [7]", got)
	}

	// The handler's Running transition time wins over the time the watch heard of it.
	b := vmi("b", v1alpha1.Running)
	b.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{
		{Phase: v1alpha1.Scheduled, PhaseTransitionTimestamp: metav1.NewTime(t0.Add(time.Second))},
		{Phase: v1alpha1.Running, PhaseTransitionTimestamp: metav1.NewTime(t0.Add(3 * time.Second))},
	}
	tr.update(b)
	if len(got) != 2 || got[1] != 3 {
		t.Fatalf("observed %v, want [7 3]", got)
	}

	// Running already when this process started (initial list): not observed, and not later.
	tr.add(vmi("c", v1alpha1.Running), true)
	tr.update(vmi("c", v1alpha1.Running))
	// Created and Running while the watch was away: observed.
	tr.add(vmi("d", v1alpha1.Running), false)
	if len(got) != 3 {
		t.Fatalf("observed %v, want 3 observations", got)
	}

	// The seen-set holds only running VMIs: it forgets deleted and finished ones.
	if n := tr.len(); n != 4 {
		t.Fatalf("seen %d VMIs, want 4", n)
	}
	tr.forget("a")
	tr.update(vmi("b", v1alpha1.Succeeded))
	tr.update(vmi("c", v1alpha1.Failed))
	if n := tr.len(); n != 1 {
		t.Fatalf("seen %d VMIs after delete and finish, want 1", n)
	}
	// A clock behind the creation time observes 0, not a negative duration.
	now = t0.Add(-time.Second)
	tr.update(vmi("e", v1alpha1.Running))
	if got[len(got)-1] != 0 {
		t.Fatalf("observed %v for a clock behind creation", got[len(got)-1])
	}
}

func TestPhaseCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		vmi("a", v1alpha1.Running), vmi("b", v1alpha1.Running), vmi("c", v1alpha1.Pending), vmi("d", v1alpha1.VMIPhaseUnset),
	).Build()
	follower, leader := make(chan struct{}), make(chan struct{})
	close(leader)
	pc := &phaseCollector{desc: phaseCounts.desc}
	reg := prometheus.NewRegistry()
	if err := reg.Register(pc); err != nil {
		t.Fatal(err)
	}

	gather := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return out
	}

	pc.add(&source{reader: c, elected: follower})
	if got := gather(); len(got) != 0 {
		t.Fatalf("a follower reported %v", got)
	}
	lead := &source{reader: c, elected: leader}
	pc.add(lead)
	got := gather()
	want := map[string]float64{"Unset": 1, "Pending": 1, "Scheduling": 0, "Scheduled": 0, "Running": 2, "Succeeded": 0, "Failed": 0, "Unknown": 0}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("phase %s: %v, want %v", k, got[k], v)
		}
	}
	pc.remove(lead)
	if got := gather(); len(got) != 0 {
		t.Fatalf("reported %v after the leader's manager stopped", got)
	}
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	for i := range 2 {
		if err := register(reg); err != nil {
			t.Fatalf("register #%d: %v", i+1, err)
		}
	}
	// A different collector under the same name is a real conflict, not a second manager.
	other := prometheus.NewRegistry()
	if err := other.Register(prometheus.NewHistogram(prometheus.HistogramOpts{Name: CreationToRunningName, Help: "x"})); err != nil {
		t.Fatal(err)
	}
	if err := register(other); err == nil {
		t.Fatal("register accepted a conflicting collector")
	}
}
