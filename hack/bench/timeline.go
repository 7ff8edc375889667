package bench

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
)

// vmiTimeline is what the bench saw of one VMI's start: when each phase was first seen, as an
// offset from the create request. `kubevisor-bench start` keeps one per run, `kubevisor-bench
// e2e` one per VMI.
type vmiTimeline struct {
	mu     sync.Mutex
	sent   time.Time
	vmi    string
	marks  map[string]time.Duration // phase → offset from sent
	order  []string                 // phases in the order they were first seen
	failed string
}

func newTimeline(vmi string) *vmiTimeline {
	return &vmiTimeline{vmi: vmi, marks: map[string]time.Duration{}}
}

// setSent sets the moment the offsets count from (just before the create request).
func (r *vmiTimeline) setSent(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = at
}

func (r *vmiTimeline) mark(phase string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.marks[phase]; ok {
		return
	}
	r.marks[phase] = at.Sub(r.sent)
	r.order = append(r.order, phase)
}

func (r *vmiTimeline) get(phase string) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.marks[phase]
	return d, ok
}

// Phases of a VMI start that every run has; the launcher pod's containers and the handler's
// steps add phases named after them.
const (
	phaseVMICreated  = "VMI created (create answered)"
	phasePodCreated  = "launcher pod created"
	phaseScheduled   = "launcher pod scheduled"
	phasePodRunning  = "launcher pod Running"
	phaseSyncStart   = "handler: sync began"
	phaseVMIRunning  = "VMI Running"
	phaseFirstByte   = "console: first byte"
	phaseMarker      = "console: marker"
	phaseStartedNote = "handler: Started event"
)

// followTimelines records what a watch of VMIs, pods or events.k8s.io events shows of the VMIs
// that timelineOf knows (nil for the others), until the watch ends.
func followTimelines(w watch.Interface, timelineOf func(vmi string) *vmiTimeline) {
	for ev := range w.ResultChan() {
		now := time.Now()
		switch o := ev.Object.(type) {
		case *v1alpha1.VirtualMachineInstance:
			run := timelineOf(o.Name)
			if run == nil {
				continue
			}
			if o.Status.Phase == v1alpha1.Running {
				run.mark(phaseVMIRunning, now)
			}
			if o.Status.Phase == v1alpha1.Failed {
				run.mu.Lock()
				run.failed = fmt.Sprintf("VMI failed: %s", o.Status.Reason)
				run.mu.Unlock()
			}
		case *corev1.Pod:
			run := timelineOf(o.Labels[v1alpha1.VirtualMachineInstanceNameLabel])
			if run == nil {
				continue
			}
			run.mark(phasePodCreated, now)
			if o.Spec.NodeName != "" {
				run.mark(phaseScheduled, now)
			}
			for _, cs := range o.Status.InitContainerStatuses {
				if cs.State.Terminated != nil {
					run.mark("init container "+cs.Name+" done", now)
				} else if cs.State.Running != nil {
					run.mark("init container "+cs.Name+" started", now)
				}
			}
			for _, cs := range o.Status.ContainerStatuses {
				if cs.State.Running != nil || cs.State.Terminated != nil {
					run.mark("container "+cs.Name+" started", now)
				}
			}
			if o.Status.Phase == corev1.PodRunning {
				run.mark(phasePodRunning, now)
			}
		case *eventsv1.Event:
			if o.Regarding.Kind != "VirtualMachineInstance" || o.Reason != v1alpha1.ReasonStarted {
				continue
			}
			run := timelineOf(o.Regarding.Name)
			if run == nil {
				continue
			}
			tl, err := handler.ParseTimelineNote(o.Note)
			if err != nil {
				continue
			}
			// The note has the sync's start on the node's clock, the bench's clock on a one-node
			// cluster; a note without it is placed back from the event's time (an upper bound:
			// the event follows the status write).
			at := tl.Start
			if at.IsZero() {
				end := o.EventTime.Time
				if end.IsZero() {
					end = now
				}
				at = end.Add(-tl.Took())
			}
			run.mark(phaseStartedNote, now)
			run.mark(phaseSyncStart, at)
			for _, st := range tl.Steps {
				at = at.Add(st.Took)
				run.mark("handler: "+st.Name+" done", at)
			}
		}
	}
}

// printPhases prints the phases the runs saw in the order of their medians: P50, P95, min and
// max of the offsets from the create request, and how many runs saw each.
func printPhases(out io.Writer, runs []*vmiTimeline) {
	seen := map[string][]time.Duration{}
	for _, r := range runs {
		r.mu.Lock()
		for p, d := range r.marks {
			seen[p] = append(seen[p], d)
		}
		r.mu.Unlock()
	}
	phases := make([]string, 0, len(seen))
	for p, xs := range seen {
		slices.Sort(xs)
		phases = append(phases, p)
	}
	// Phases of the same P50 (the handler's steps end within a millisecond) keep the order the
	// runs saw them in: their least position in a run's order.
	pos := map[string]int{}
	for _, r := range runs {
		r.mu.Lock()
		for i, p := range r.order {
			if j, ok := pos[p]; !ok || i < j {
				pos[p] = i
			}
		}
		r.mu.Unlock()
	}
	p50 := func(p string) time.Duration { return percentile(seen[p], 50) }
	sort.SliceStable(phases, func(i, j int) bool {
		if p50(phases[i]) != p50(phases[j]) {
			return p50(phases[i]) < p50(phases[j])
		}
		return pos[phases[i]] < pos[phases[j]]
	})
	tab := table{w: out, widths: []int{52, 9, 9, 9, 9, 5}}
	tab.row("phase", "P50", "P95", "min", "max", "runs")
	for _, p := range phases {
		xs := seen[p]
		tab.row(p, fmt.Sprintf("%.3f", p50(p).Seconds()), fmt.Sprintf("%.3f", percentile(xs, 95).Seconds()),
			fmt.Sprintf("%.3f", xs[0].Seconds()), fmt.Sprintf("%.3f", xs[len(xs)-1].Seconds()), fmt.Sprint(len(xs)))
	}
}
