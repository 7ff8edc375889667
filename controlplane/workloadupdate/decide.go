// Package workloadupdate is kubevisor-controller's workload updater (KubeVirt's
// workload-updater): it marks the running VMIs whose launcher pod runs another launcher image
// than the controller's (after an upgrade) and, per the workload update strategy, live-migrates
// them (the target pod is built with the current image) or evicts their launcher pods, a batch
// at a time.
//
// Decide is the pure decision over every VMI of the cluster; the reconciler reads the objects,
// calls it, and acts. Limits: the time of the last batch is held in memory, so a restarted (or
// newly elected) controller may start a batch at once; the batch bounds how many migrations
// are created per interval, not how many run at once (the migration controller queues them
// under its parallel limits, in Pending); an eviction refused (a PodDisruptionBudget, the
// eviction webhook) is tried again at a later batch.
package workloadupdate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/controlplane/evacuation"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// Defaults and bounds of Settings (KubeVirt's).
const (
	DefaultBatchSize     = 10
	DefaultBatchInterval = time.Minute
	MinBatchInterval     = time.Second
	// FailedMigrationBackoff is how long after a failed migration of the workload updater the
	// VMI waits before the next one (a VMI that cannot move would otherwise get a migration per
	// batch).
	FailedMigrationBackoff = 5 * time.Minute
)

// Settings are the workload update strategy kubevisor-controller runs with (the operator maps
// the Kubevisor's spec.workloadUpdateStrategy onto its flags).
type Settings struct {
	// Methods are the ways an outdated VMI is moved to the current launcher; none: the VMIs are
	// only marked.
	Methods []v1alpha1.WorkloadUpdateMethod
	// BatchSize is how many VMIs are migrated or evicted per batch; 0 means DefaultBatchSize.
	BatchSize int
	// BatchInterval is the time between two batches; 0 means DefaultBatchInterval.
	BatchInterval time.Duration
}

// DefaultSettings are KubeVirt's defaults: no method (mark only), 10 per minute.
func DefaultSettings() Settings {
	return Settings{BatchSize: DefaultBatchSize, BatchInterval: DefaultBatchInterval}
}

// Validate refuses what the controller cannot run with.
func (s Settings) Validate() error {
	for _, m := range s.Methods {
		if m != v1alpha1.WorkloadUpdateMethodLiveMigrate && m != v1alpha1.WorkloadUpdateMethodEvict {
			return fmt.Errorf("workload update method %q: must be LiveMigrate or Evict", m)
		}
	}
	if s.BatchSize < 0 {
		return fmt.Errorf("workload update batch size %d: must be at least 1", s.BatchSize)
	}
	if s.BatchInterval != 0 && s.BatchInterval < MinBatchInterval {
		return fmt.Errorf("workload update batch interval %s: must be at least %s", s.BatchInterval, MinBatchInterval)
	}
	return nil
}

// ParseMethods reads a comma-separated list of methods ("" is none), as the
// --workload-update-methods flag takes it.
func ParseMethods(s string) ([]v1alpha1.WorkloadUpdateMethod, error) {
	var out []v1alpha1.WorkloadUpdateMethod
	for _, f := range strings.Split(s, ",") {
		m := v1alpha1.WorkloadUpdateMethod(strings.TrimSpace(f))
		switch {
		case m == "":
		case m != v1alpha1.WorkloadUpdateMethodLiveMigrate && m != v1alpha1.WorkloadUpdateMethodEvict:
			return nil, fmt.Errorf("workload update method %q: must be LiveMigrate or Evict", m)
		case !slices.Contains(out, m):
			out = append(out, m)
		}
	}
	return out, nil
}

func (s Settings) has(m v1alpha1.WorkloadUpdateMethod) bool { return slices.Contains(s.Methods, m) }

func (s Settings) size() int {
	if s.BatchSize > 0 {
		return s.BatchSize
	}
	return DefaultBatchSize
}

func (s Settings) interval() time.Duration {
	if s.BatchInterval > 0 {
		return s.BatchInterval
	}
	return DefaultBatchInterval
}

// Workload is one VMI and what Decide needs of it.
type Workload struct {
	// VMI is the VMI.
	VMI *v1alpha1.VirtualMachineInstance
	// Pod is its launcher pod (status.launcherPodName); nil when it was not found.
	Pod *corev1.Pod
	// Migrations are the VMI's migrations (spec.vmiName is its name).
	Migrations []v1alpha1.VirtualMachineInstanceMigration
}

// Observation is what the workload updater saw; Decide acts on it alone.
type Observation struct {
	// LauncherImage is the current launcher image (kubevisor-controller's --launcher-image).
	LauncherImage string
	// Settings is the strategy.
	Settings Settings
	// Workloads are the cluster's VMIs.
	Workloads []Workload
	// LastBatch is when the last batch acted (zero: none yet), Now the time of the observation.
	LastBatch, Now time.Time
	// Held, when not empty, says why no batch may act now: the node agents are not all on the
	// current version yet (a rollout of the handler DaemonSet under way). A migration started
	// then could lose its source or target handler mid-way, and an eviction would start the VM
	// again on a node whose handler is about to be replaced. Marking goes on.
	Held string
}

// HeldRecheck is how soon a held updater looks again (the handler DaemonSet is read, not
// watched, so its rollout's end is not an event of the updater's).
const HeldRecheck = 5 * time.Second

// Action is one migration or eviction of a batch.
type Action struct {
	// Method is LiveMigrate (create a migration of VMI) or Evict (evict Pod).
	Method v1alpha1.WorkloadUpdateMethod
	VMI    *v1alpha1.VirtualMachineInstance
	Pod    *corev1.Pod
}

// Decision is what the workload updater does.
type Decision struct {
	// Mark are the VMIs to label OutdatedLauncherImageLabel, Unmark those to unlabel.
	Mark, Unmark []*v1alpha1.VirtualMachineInstance
	// Batch are the migrations and evictions to start now (at most the batch size).
	Batch []Action
	// Outdated is how many VMIs run another launcher image; Left how many of them an action
	// would apply to that this batch leaves for the next ones (or that wait out a backoff).
	Outdated, Left int
	// Wait, when not zero, is when to look again: the next batch, the end of a backoff, or
	// HeldRecheck.
	Wait time.Duration
	// Held is Observation.Held when it kept a batch from acting.
	Held string
}

// state is what a VMI's launcher says about it.
type state int

const (
	unknown  state = iota // not running, or its launcher pod is not known: its label stays
	current               // no label wanted
	outdated              // label wanted
)

// launcherState compares w's launcher pod's compute container image with image.
func launcherState(w Workload, image string) state {
	vmi := w.VMI
	if vmi.Status.Phase.IsFinal() {
		return current
	}
	if vmi.Status.Phase != v1alpha1.Running || w.Pod == nil || w.Pod.Name != vmi.Status.LauncherPodName ||
		w.Pod.Labels[v1alpha1.CreatedByLabel] != string(vmi.UID) {
		return unknown
	}
	for _, c := range w.Pod.Spec.Containers {
		if c.Name == layout.ComputeContainer {
			if c.Image == image {
				return current
			}
			return outdated
		}
	}
	return unknown
}

// busy says why w is not to be acted on now: a migration of it has not finished (anyone's),
// it is being evacuated, or its launcher pod is going already; "" when it is not busy.
func busy(w Workload) string {
	vmi := w.VMI
	for i := range w.Migrations {
		if m := &w.Migrations[i]; evacuation.Unfinished(m) {
			return "migration " + m.Name + " has not finished"
		}
	}
	if s := vmi.Status.MigrationState; s != nil && !s.Failed && (!s.Completed || (s.TargetPod != "" && s.TargetPod != vmi.Status.LauncherPodName)) {
		return "a migration is moving it"
	}
	if vmi.Status.EvacuationNodeName != "" {
		return "it is being evacuated off node " + vmi.Status.EvacuationNodeName
	}
	if w.Pod.DeletionTimestamp != nil {
		return "its launcher pod is being deleted"
	}
	return ""
}

// backoff is how long w still waits after its last failed workload-update migration (0: none),
// if its last workload-update migration failed.
func backoff(w Workload, now time.Time) time.Duration {
	var last *v1alpha1.VirtualMachineInstanceMigration
	for i := range w.Migrations {
		m := &w.Migrations[i]
		if _, ours := m.Labels[v1alpha1.WorkloadUpdateLabel]; !ours {
			continue
		}
		if last == nil || m.CreationTimestamp.After(last.CreationTimestamp.Time) {
			last = m
		}
	}
	if last == nil || last.Status.Phase != v1alpha1.MigrationFailed {
		return 0
	}
	end := last.CreationTimestamp.Time
	for _, t := range last.Status.PhaseTransitionTimestamps {
		if t.Phase == v1alpha1.MigrationFailed {
			end = t.PhaseTransitionTimestamp.Time
		}
	}
	return max(end.Add(FailedMigrationBackoff).Sub(now), 0)
}

// Decide returns what the workload updater does. It is pure.
//
// A Running VMI whose launcher pod's compute container runs another image than LauncherImage
// is outdated and marked; a VMI marked that runs the current image (after a migration, say),
// or has finished, is unmarked; a VMI being deleted, not yet Running or whose launcher pod is
// not known is left as it is. An outdated VMI that is not busy (a migration of it unfinished,
// an evacuation, its launcher pod being deleted) gets, with LiveMigrate and the VMI
// LiveMigratable, a migration (not within FailedMigrationBackoff of a failed one of the
// updater's), else with Evict an eviction of its launcher pod; with neither nothing. At most
// BatchSize of those per BatchInterval since LastBatch, the VMIs taken by namespace and name.
// While Held, no batch acts and the updater looks again after HeldRecheck.
func Decide(obs Observation) Decision {
	var d Decision
	type candidate struct {
		Action
		key string
	}
	var cands []candidate
	var waitBackoff time.Duration
	for _, w := range obs.Workloads {
		vmi := w.VMI
		if vmi.DeletionTimestamp != nil {
			continue
		}
		_, marked := vmi.Labels[v1alpha1.OutdatedLauncherImageLabel]
		st := launcherState(w, obs.LauncherImage)
		switch {
		case st == current && marked:
			d.Unmark = append(d.Unmark, vmi)
		case st == outdated && !marked:
			d.Mark = append(d.Mark, vmi)
		}
		if st != outdated {
			continue
		}
		d.Outdated++
		if busy(w) != "" {
			continue
		}
		a := Action{VMI: vmi, Pod: w.Pod}
		migratable, _ := evacuation.LiveMigratable(vmi)
		switch {
		case obs.Settings.has(v1alpha1.WorkloadUpdateMethodLiveMigrate) && migratable:
			if wait := backoff(w, obs.Now); wait > 0 {
				d.Left++
				if waitBackoff == 0 || wait < waitBackoff {
					waitBackoff = wait
				}
				continue
			}
			a.Method = v1alpha1.WorkloadUpdateMethodLiveMigrate
		case obs.Settings.has(v1alpha1.WorkloadUpdateMethodEvict):
			a.Method = v1alpha1.WorkloadUpdateMethodEvict
		default:
			continue
		}
		cands = append(cands, candidate{a, vmi.Namespace + "/" + vmi.Name})
	}
	slices.SortFunc(cands, func(a, b candidate) int { return cmp.Compare(a.key, b.key) })

	interval := obs.Settings.interval()
	if obs.Held != "" {
		d.Left += len(cands)
		if len(cands) > 0 {
			d.Held, d.Wait = obs.Held, HeldRecheck
		}
	} else if next := obs.LastBatch.Add(interval); !obs.LastBatch.IsZero() && obs.Now.Before(next) {
		d.Left += len(cands)
		if len(cands) > 0 {
			d.Wait = next.Sub(obs.Now)
		}
	} else {
		n := min(len(cands), obs.Settings.size())
		for _, c := range cands[:n] {
			d.Batch = append(d.Batch, c.Action)
		}
		d.Left += len(cands) - n
		// Look again at the next batch: for the VMIs left, and for those whose action did not
		// take (a refused eviction).
		if len(cands) > 0 {
			d.Wait = interval
		}
	}
	if waitBackoff > 0 && (d.Wait == 0 || waitBackoff < d.Wait) {
		d.Wait = waitBackoff
	}
	return d
}
