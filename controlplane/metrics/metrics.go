// Package metrics exports Kubevisor's control-plane metrics (VMIs per phase, VMI creation to
// Running latency) in controller-runtime's registry, next to its per-controller reconcile metrics.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Metric names.
const (
	// VMIPhaseCountName is a gauge of the VMIs in each phase (label phase; "Unset" for none yet).
	VMIPhaseCountName = "kubevisor_vmi_phase_count"
	// CreationToRunningName is a histogram of the seconds from a VMI's creation to its Running phase.
	CreationToRunningName = "kubevisor_vmi_creation_to_running_seconds"
)

// listTimeout bounds a scrape's read of the cache; a cache that has not synced yields no gauge.
const listTimeout = 5 * time.Second

// phases are reported even at zero, so that a phase's series exists before its first VMI.
var phases = []v1alpha1.VirtualMachineInstancePhase{
	v1alpha1.VMIPhaseUnset, v1alpha1.Pending, v1alpha1.Scheduling, v1alpha1.Scheduled,
	v1alpha1.Running, v1alpha1.Succeeded, v1alpha1.Failed, v1alpha1.Unknown,
}

var (
	// creationToRunning is process-wide: the registry is, and only the leader observes into it.
	creationToRunning = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    CreationToRunningName,
		Help:    "Seconds from a VMI's creation to the first time it was seen Running (observed by the leader).",
		Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800},
	})
	phaseCounts = &phaseCollector{desc: prometheus.NewDesc(VMIPhaseCountName,
		"Number of VMIs in each phase, as the leader's cache holds them.", []string{"phase"}, nil)}
)

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=list;watch

// SetupWithManager registers the metrics in controller-runtime's registry (once per process: a
// second manager in the same process finds them registered) and adds to mgr what feeds them.
func SetupWithManager(mgr ctrl.Manager) error {
	if err := register(ctrlmetrics.Registry); err != nil {
		return err
	}
	src := &source{reader: mgr.GetCache(), elected: mgr.Elected()}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		phaseCounts.add(src)
		<-ctx.Done()
		phaseCounts.remove(src)
		return nil
	})); err != nil {
		return fmt.Errorf("add VMI phase source: %w", err)
	}
	if err := mgr.Add(&runningWatch{cache: mgr.GetCache(), t: newTracker(creationToRunning.Observe, time.Now)}); err != nil {
		return fmt.Errorf("add VMI running watch: %w", err)
	}
	return nil
}

func register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{creationToRunning, phaseCounts} {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) && are.ExistingCollector == c {
				continue
			}
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// source is one manager's view: its cache, and whether it leads.
type source struct {
	reader  client.Reader
	elected <-chan struct{}
}

func (s *source) leads() bool {
	select {
	case <-s.elected:
		return true
	default:
		return false
	}
}

// phaseCollector counts VMIs per phase at scrape time from the cache of the manager that leads,
// so that replicas do not report the same VMIs twice and a follower reports nothing.
type phaseCollector struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	sources []*source
}

func (c *phaseCollector) add(s *source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, s)
}

func (c *phaseCollector) remove(s *source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = slices.DeleteFunc(c.sources, func(x *source) bool { return x == s })
}

func (c *phaseCollector) leader() *source {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sources {
		if s.leads() {
			return s
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *phaseCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.leader()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	var list v1alpha1.VirtualMachineInstanceList
	if err := s.reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, fmt.Errorf("list VMIs from the cache: %w", err))
		return
	}
	counts := make(map[v1alpha1.VirtualMachineInstancePhase]int, len(phases))
	for i := range list.Items {
		counts[list.Items[i].Status.Phase]++
	}
	for _, p := range phases {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[p]), phaseLabel(p))
	}
}

func phaseLabel(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == v1alpha1.VMIPhaseUnset {
		return "Unset"
	}
	return string(p)
}

// runningWatch feeds the creation-to-running histogram from the cache's VMI informer; it runs on
// the leader only, so that two replicas do not observe the same VMI.
type runningWatch struct {
	cache cache.Informers
	t     *tracker
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (w *runningWatch) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (w *runningWatch) Start(ctx context.Context) error {
	inf, err := w.cache.GetInformer(ctx, &v1alpha1.VirtualMachineInstance{})
	if err != nil {
		return fmt.Errorf("VMI informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if vmi, ok := obj.(*v1alpha1.VirtualMachineInstance); ok {
				w.t.add(vmi, initial)
			}
		},
		UpdateFunc: func(_, obj any) {
			if vmi, ok := obj.(*v1alpha1.VirtualMachineInstance); ok {
				w.t.update(vmi)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if vmi, ok := obj.(*v1alpha1.VirtualMachineInstance); ok {
				w.t.forget(vmi.UID)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch VMIs: %w", err)
	}
	<-ctx.Done()
	return inf.RemoveEventHandler(reg)
}

// tracker observes each VMI once, the first time it is seen Running. The seen-set holds only
// VMIs that are Running now: a VMI leaves it when deleted or when it reaches Succeeded or Failed
// (a VMI never runs again after those), so it is bounded by the Running VMIs of the cluster.
type tracker struct {
	observe func(float64)
	now     func() time.Time
	mu      sync.Mutex
	seen    map[types.UID]struct{}
}

func newTracker(observe func(float64), now func() time.Time) *tracker {
	return &tracker{observe: observe, now: now, seen: map[types.UID]struct{}{}}
}

// add handles a VMI the informer delivers as new. One that is Running in the initial list (at
// start, or when this replica became leader) ran before this process looked: it is marked seen
// without an observation, so that a restart does not observe every running VMI again.
func (t *tracker) add(vmi *v1alpha1.VirtualMachineInstance, initial bool) {
	if initial && vmi.Status.Phase == v1alpha1.Running {
		t.mu.Lock()
		t.seen[vmi.UID] = struct{}{}
		t.mu.Unlock()
		return
	}
	t.update(vmi)
}

func (t *tracker) update(vmi *v1alpha1.VirtualMachineInstance) {
	switch vmi.Status.Phase {
	case v1alpha1.Succeeded, v1alpha1.Failed:
		t.forget(vmi.UID)
		return
	case v1alpha1.Running:
	default:
		return
	}
	t.mu.Lock()
	_, seen := t.seen[vmi.UID]
	t.seen[vmi.UID] = struct{}{}
	t.mu.Unlock()
	if seen {
		return
	}
	running := t.now()
	// The handler's record of when the VMI entered Running is closer to the truth than the
	// moment this watch heard of it.
	for _, pt := range vmi.Status.PhaseTransitionTimestamps {
		if pt.Phase == v1alpha1.Running && !pt.PhaseTransitionTimestamp.IsZero() {
			running = pt.PhaseTransitionTimestamp.Time
		}
	}
	t.observe(max(0, running.Sub(vmi.CreationTimestamp.Time).Seconds()))
}

func (t *tracker) forget(uid types.UID) {
	t.mu.Lock()
	delete(t.seen, uid)
	t.mu.Unlock()
}

func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.seen)
}
