// Package evacuation moves VMIs off a node that is being drained: the decision of kubevisor-api's
// eviction webhook (Evict: an eviction of a launcher pod becomes a live migration and is
// answered 429), and the evacuation controller that creates the migrations of the VMIs the
// webhook marked (status.evacuationNodeName) and keeps a PodDisruptionBudget per VMI whose
// eviction strategy protects it.
package evacuation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Strategy returns the eviction strategy that applies to vmi: its own, else the cluster's
// default (def), else None. Both kubevisor-api and kubevisor-controller take the default from
// their --default-eviction-strategy flag.
func Strategy(vmi *v1alpha1.VirtualMachineInstance, def v1alpha1.EvictionStrategy) v1alpha1.EvictionStrategy {
	if s := vmi.Spec.EvictionStrategy; s != nil && *s != "" {
		return *s
	}
	if def != "" {
		return def
	}
	return v1alpha1.EvictionStrategyNone
}

// ParseStrategy checks a cluster default given on the command line ("" is None).
func ParseStrategy(s string) (v1alpha1.EvictionStrategy, error) {
	switch v1alpha1.EvictionStrategy(s) {
	case "", v1alpha1.EvictionStrategyNone:
		return v1alpha1.EvictionStrategyNone, nil
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible, v1alpha1.EvictionStrategyExternal:
		return v1alpha1.EvictionStrategy(s), nil
	}
	return "", fmt.Errorf("eviction strategy %q: must be None, LiveMigrate, LiveMigrateIfPossible or External", s)
}

// LiveMigratable returns whether vmi's LiveMigratable condition is True, and the condition's
// reason and message when it is not.
func LiveMigratable(vmi *v1alpha1.VirtualMachineInstance) (bool, string) {
	c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	switch {
	case c == nil:
		return false, "it has no LiveMigratable condition yet"
	case c.Status != corev1.ConditionTrue:
		return false, fmt.Sprintf("it is not LiveMigratable: %s: %s", c.Reason, c.Message)
	}
	return true, ""
}

// Protected reports whether vmi's eviction strategy keeps its launcher pod from being evicted
// (the webhook refuses, the PodDisruptionBudget backs it up): LiveMigrate and External always,
// LiveMigrateIfPossible while the VMI is LiveMigratable.
func Protected(vmi *v1alpha1.VirtualMachineInstance, def v1alpha1.EvictionStrategy) bool {
	switch Strategy(vmi, def) {
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyExternal:
		return true
	case v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		ok, _ := LiveMigratable(vmi)
		return ok
	}
	return false
}

// EvictionVerdict is the webhook's answer to an eviction of a launcher pod.
type EvictionVerdict struct {
	// Allow lets the eviction proceed (the PodDisruptionBudget still applies).
	Allow bool
	// Mark is the node to write into the VMI's status.evacuationNodeName before refusing; empty
	// writes nothing.
	Mark string
	// Message says why the eviction is refused (answered 429 TooManyRequests, which kubectl
	// drain retries).
	Message string
}

func refuse(format string, args ...any) EvictionVerdict {
	return EvictionVerdict{Message: fmt.Sprintf(format, args...)}
}

// Evict decides an eviction of pod, a launcher pod of vmi (nil: the VMI does not exist), under
// the cluster's default strategy def. It is pure; the webhook reads the objects and writes the
// mark.
//
// Strategy None, a pod that is not the VMI's current launcher pod (a migration's target, or the
// source a completed migration left) and a VMI that has finished: the eviction proceeds.
// LiveMigrate (and LiveMigrateIfPossible with the VMI LiveMigratable): the VMI is marked for
// evacuation of the pod's node and the eviction refused, again on each retry until the pod is
// gone (the VMI controller deletes it once the migration completed); a VMI that is not Running
// yet, or not LiveMigratable, is refused without a mark, so the drain waits and the VM keeps
// running. External: marked and refused, the migration left to someone else.
func Evict(pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance, def v1alpha1.EvictionStrategy) EvictionVerdict {
	if vmi == nil || vmi.DeletionTimestamp != nil || vmi.Status.Phase.IsFinal() {
		return EvictionVerdict{Allow: true}
	}
	strategy := Strategy(vmi, def)
	if strategy == v1alpha1.EvictionStrategyNone {
		return EvictionVerdict{Allow: true}
	}
	if vmi.Status.LauncherPodName != "" && vmi.Status.LauncherPodName != pod.Name {
		return EvictionVerdict{Allow: true}
	}
	node := pod.Spec.NodeName
	migratable, why := LiveMigratable(vmi)
	if strategy == v1alpha1.EvictionStrategyLiveMigrateIfPossible {
		if !migratable {
			return EvictionVerdict{Allow: true}
		}
		strategy = v1alpha1.EvictionStrategyLiveMigrate
	}
	name := vmi.Namespace + "/" + vmi.Name
	if vmi.Status.EvacuationNodeName != "" && vmi.Status.EvacuationNodeName == node {
		if strategy == v1alpha1.EvictionStrategyExternal {
			return refuse("VMI %s has evictionStrategy External: it is marked for evacuation of node %s and waits for an external controller to move it", name, node)
		}
		return refuse("VMI %s is being live-migrated off node %s; its launcher pod %s goes once the migration completes", name, node, pod.Name)
	}
	if strategy == v1alpha1.EvictionStrategyExternal {
		return EvictionVerdict{Mark: node, Message: fmt.Sprintf("VMI %s has evictionStrategy External: marked for evacuation of node %s, for an external controller to move it", name, node)}
	}
	if vmi.Status.Phase != v1alpha1.Running {
		return refuse("VMI %s has evictionStrategy LiveMigrate and is %s, not Running: it can be migrated once it runs", name, phaseWord(vmi.Status.Phase))
	}
	if !migratable {
		return refuse("VMI %s has evictionStrategy LiveMigrate but cannot be migrated: %s", name, why)
	}
	return EvictionVerdict{Mark: node, Message: fmt.Sprintf("VMI %s is being live-migrated off node %s (evictionStrategy LiveMigrate); its launcher pod %s goes once the migration completes", name, node, pod.Name)}
}

func phaseWord(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == "" {
		return "not started"
	}
	return string(p)
}

// Defaults of the evacuation controller's backoff between a failed evacuation migration and
// the next.
const (
	DefaultRetryBackoff    = 10 * time.Second
	DefaultMaxRetryBackoff = 5 * time.Minute
)

// Observation is what the evacuation controller saw for one VMI; Decide acts on it alone.
type Observation struct {
	// VMI is the VMI (it exists).
	VMI *v1alpha1.VirtualMachineInstance
	// DefaultStrategy is the cluster's default eviction strategy.
	DefaultStrategy v1alpha1.EvictionStrategy
	// Migrations are the VMI's migrations (spec.vmiName is its name), marked or not.
	Migrations []v1alpha1.VirtualMachineInstanceMigration
	// Unfinished is how many migrations of the cluster have not finished, and UnfinishedFromNode
	// how many of those move a VMI off the evacuated node.
	Unfinished, UnfinishedFromNode int
	// PerCluster and PerNode are the limits on parallel migrations (the migration controller's).
	PerCluster, PerNode int
	// PDBExists says the VMI's PodDisruptionBudget exists, and PDBMinAvailable is its
	// minAvailable.
	PDBExists       bool
	PDBMinAvailable int
	// Now is the time of the observation, and RetryBackoff, MaxRetryBackoff the delay after a
	// failed evacuation migration (doubling per failure, capped).
	Now                           time.Time
	RetryBackoff, MaxRetryBackoff time.Duration
}

// Decision is what the evacuation controller does for one VMI.
type Decision struct {
	// ClearMark removes status.evacuationNodeName: the VMI left the node, or finished.
	ClearMark bool
	// CreateMigration creates a migration of the VMI off the marked node.
	CreateMigration bool
	// Wait, when not zero, is when to look again (the backoff after a failed migration, or a
	// limit on parallel migrations); WaitReason says why.
	Wait       time.Duration
	WaitReason string
	// EnsurePDB creates the VMI's PodDisruptionBudget, UpdatePDB sets the minAvailable of the
	// one there, both to PDBMinAvailable; DeletePDB removes it.
	EnsurePDB, UpdatePDB, DeletePDB bool
	PDBMinAvailable                 int
}

// PDBMinAvailable is the minAvailable of a protected VMI's PodDisruptionBudget: 1 (its launcher
// pod), or 2 while a migration of the VMI is unfinished. The budget selects the migration's
// target pod too (it carries the VMI's created-by label), so at 1 it would let an eviction take
// the source pod, whose VM is being migrated, once the target is ready; at 2 neither pod of a
// migration can be evicted, and the budget holds whether or not the eviction webhook is reached
// (its failurePolicy is Ignore). A migration's pods are deleted by the controllers, which
// budgets do not hold back.
func PDBMinAvailable(migrations []v1alpha1.VirtualMachineInstanceMigration) int {
	for i := range migrations {
		if Unfinished(&migrations[i]) {
			return 2
		}
	}
	return 1
}

// Unfinished reports whether m has neither succeeded nor failed.
func Unfinished(m *v1alpha1.VirtualMachineInstanceMigration) bool {
	return m.Status.Phase != v1alpha1.MigrationSucceeded && m.Status.Phase != v1alpha1.MigrationFailed
}

// Decide returns what to do for obs.VMI. It is pure.
//
// The PodDisruptionBudget exists while the VMI is not final nor being deleted and its strategy
// protects it (Protected), with minAvailable PDBMinAvailable of its migrations. A marked VMI that no longer runs on the marked node (it moved, or
// finished) is unmarked. A marked VMI still there, with strategy LiveMigrate (or
// LiveMigrateIfPossible), gets one migration at a time: none while one of its migrations is
// unfinished or one completed and the VMI is being moved to its target (as its status says, or
// as the migration says while the VMI's status lags), none while the
// parallel limits are reached, and after a failed evacuation
// migration the next waits RetryBackoff, doubled for each failure in a row since the last
// success, at most MaxRetryBackoff.
func Decide(obs Observation) Decision {
	vmi := obs.VMI
	var d Decision
	live := vmi.DeletionTimestamp == nil && !vmi.Status.Phase.IsFinal()
	want := live && Protected(vmi, obs.DefaultStrategy)
	minAvailable := PDBMinAvailable(obs.Migrations)
	d.EnsurePDB = want && !obs.PDBExists
	d.UpdatePDB = want && obs.PDBExists && obs.PDBMinAvailable != minAvailable
	d.DeletePDB = !want && obs.PDBExists
	if d.EnsurePDB || d.UpdatePDB {
		d.PDBMinAvailable = minAvailable
	}

	node := vmi.Status.EvacuationNodeName
	if node == "" {
		return d
	}
	if !live || vmi.Status.NodeName != node {
		d.ClearMark = true
		return d
	}
	strategy := Strategy(vmi, obs.DefaultStrategy)
	if strategy != v1alpha1.EvictionStrategyLiveMigrate && strategy != v1alpha1.EvictionStrategyLiveMigrateIfPossible {
		return d
	}
	var lastFailure time.Time
	failures := 0
	for i := range obs.Migrations {
		m := &obs.Migrations[i]
		if Unfinished(m) {
			return d
		}
	}
	// A migration off the node completed and the VMI controller has yet to move the VMI to
	// its target: the VMI is leaving already.
	if s := vmi.Status.MigrationState; s != nil && s.Completed && !s.Failed && s.TargetNode != "" && s.TargetNode != node {
		return d
	}
	// Failures in a row: evacuation migrations that failed since the VMI's last success.
	lastSuccess := time.Time{}
	var succeeded *v1alpha1.VirtualMachineInstanceMigration
	for i := range obs.Migrations {
		m := &obs.Migrations[i]
		if m.Status.Phase == v1alpha1.MigrationSucceeded && m.CreationTimestamp.After(lastSuccess) {
			lastSuccess, succeeded = m.CreationTimestamp.Time, m
		}
	}
	// The VMI's latest successful migration moved it off the node, yet the VMI still says it
	// runs there: its status lags the migration's (the VMI controller has not written it yet, or
	// this controller's cache of VMIs is behind its cache of migrations). It is leaving: look
	// again shortly rather than start another migration.
	if succeeded != nil {
		if s := succeeded.Status.MigrationState; s != nil && s.SourceNode == node {
			d.Wait, d.WaitReason = statusLagWait, fmt.Sprintf("migration %s moved the VMI off node %s; its status does not say so yet", succeeded.Name, node)
			return d
		}
	}
	for i := range obs.Migrations {
		m := &obs.Migrations[i]
		if m.Status.Phase != v1alpha1.MigrationFailed || m.Labels[v1alpha1.EvacuationLabel] == "" || !m.CreationTimestamp.After(lastSuccess) {
			continue
		}
		failures++
		if end := endOf(m); end.After(lastFailure) {
			lastFailure = end
		}
	}
	if failures > 0 {
		backoff := obs.RetryBackoff
		if backoff <= 0 {
			backoff = DefaultRetryBackoff
		}
		maxBackoff := max(obs.MaxRetryBackoff, backoff)
		if obs.MaxRetryBackoff <= 0 {
			maxBackoff = max(DefaultMaxRetryBackoff, backoff)
		}
		for i := 1; i < failures && backoff < maxBackoff; i++ {
			backoff *= 2
		}
		backoff = min(backoff, maxBackoff)
		if wait := lastFailure.Add(backoff).Sub(obs.Now); wait > 0 {
			d.Wait, d.WaitReason = wait, fmt.Sprintf("%d evacuation migration(s) failed in a row; next in %s", failures, wait.Round(time.Second))
			return d
		}
	}
	if obs.PerCluster > 0 && obs.Unfinished >= obs.PerCluster {
		d.Wait, d.WaitReason = throttleWait, fmt.Sprintf("%d migrations unfinished in the cluster (limit %d)", obs.Unfinished, obs.PerCluster)
		return d
	}
	if obs.PerNode > 0 && obs.UnfinishedFromNode >= obs.PerNode {
		d.Wait, d.WaitReason = throttleWait, fmt.Sprintf("%d migrations unfinished off node %s (limit %d)", obs.UnfinishedFromNode, node, obs.PerNode)
		return d
	}
	d.CreateMigration = true
	return d
}

// throttleWait is when to look again at a VMI held back by a parallel limit (a migration
// finishing also brings it back).
const throttleWait = 5 * time.Second

// statusLagWait is when to look again at a VMI whose status lags its successful migration (the
// VMI's update also brings it back).
const statusLagWait = 2 * time.Second

// endOf is when migration m ended: its Failed phase's transition, else its creation.
func endOf(m *v1alpha1.VirtualMachineInstanceMigration) time.Time {
	for _, t := range m.Status.PhaseTransitionTimestamps {
		if t.Phase == m.Status.Phase {
			return t.PhaseTransitionTimestamp.Time
		}
	}
	return m.CreationTimestamp.Time
}

// PDBName is the name of vmi's PodDisruptionBudget: "kubevisor-eviction-" and the VMI's name, or
// a hash of it when that would be longer than an object name may be.
func PDBName(vmi *v1alpha1.VirtualMachineInstance) string {
	n := "kubevisor-eviction-" + vmi.Name
	if len(n) > 253 {
		sum := sha256.Sum256([]byte(vmi.Name))
		n = "kubevisor-eviction-" + hex.EncodeToString(sum[:16])
	}
	return n
}
