package migration

import (
	"errors"
	"fmt"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The migration controller reads MigrationPolicies and the labels of the migrating VMI's
// namespace to resolve the settings of a migration (Resolve).
//
// +kubebuilder:rbac:groups=kubevisor.io,resources=migrationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Cluster defaults of a migration's settings, KubeVirt's: no bandwidth limit, 150 s per GiB,
// neither auto-converge nor post-copy.
const (
	DefaultCompletionTimeoutPerGiB int64 = 150
	DefaultAllowAutoConverge             = false
	DefaultAllowPostCopy                 = false
	// DefaultProgressTimeout is how many seconds a migration may go without progress.
	DefaultProgressTimeout int64 = 150
	// DefaultParallelMigrationsPerCluster is how many migrations run at once in the cluster.
	DefaultParallelMigrationsPerCluster = 5
	// DefaultParallelOutboundMigrationsPerNode is how many migrations leave one node at once.
	DefaultParallelOutboundMigrationsPerNode = 2
)

// Settings are what one migration runs with: the cluster's defaults (kubevisor-controller's
// --migration-* flags), each replaced by the matching MigrationPolicy's field where it sets one.
type Settings struct {
	// AllowAutoConverge lets the hypervisor throttle the guest's vCPUs to make the copy converge.
	AllowAutoConverge bool
	// BandwidthPerMigration limits each migration, in bytes per second; zero means no limit.
	BandwidthPerMigration resource.Quantity
	// CompletionTimeoutPerGiB is how many seconds the migration may take per GiB it copies.
	CompletionTimeoutPerGiB int64
	// AllowPostCopy lets a migration that does not converge switch to post-copy.
	AllowPostCopy bool

	// The cluster's own settings, which no policy changes.

	// ProgressTimeout is how many seconds a migration may go without progress (the memory left
	// to copy reaching a new low) before the source cancels it.
	ProgressTimeout int64
	// ParallelMigrationsPerCluster is how many migrations may run at once in the cluster; more
	// wait in Pending.
	ParallelMigrationsPerCluster int
	// ParallelOutboundMigrationsPerNode is how many migrations may leave one node at once.
	ParallelOutboundMigrationsPerNode int
}

// DefaultSettings are the cluster defaults when none is configured.
func DefaultSettings() Settings {
	return Settings{
		AllowAutoConverge:       DefaultAllowAutoConverge,
		CompletionTimeoutPerGiB: DefaultCompletionTimeoutPerGiB,
		AllowPostCopy:           DefaultAllowPostCopy,

		ProgressTimeout:                   DefaultProgressTimeout,
		ParallelMigrationsPerCluster:      DefaultParallelMigrationsPerCluster,
		ParallelOutboundMigrationsPerNode: DefaultParallelOutboundMigrationsPerNode,
	}
}

// Validate says what is wrong with s as cluster defaults, by the rules the MigrationPolicy CRD
// applies to the same fields: a bandwidth that is not negative, a timeout of at least 1 s per GiB.
func (s Settings) Validate() error {
	var errs []error
	if s.BandwidthPerMigration.Sign() < 0 {
		errs = append(errs, fmt.Errorf("bandwidthPerMigration %s: must not be negative (0 means no limit)", s.BandwidthPerMigration.String()))
	}
	if s.CompletionTimeoutPerGiB < 1 {
		errs = append(errs, fmt.Errorf("completionTimeoutPerGiB %d: must be at least 1", s.CompletionTimeoutPerGiB))
	}
	if s.ProgressTimeout < 1 {
		errs = append(errs, fmt.Errorf("progressTimeout %d: must be at least 1", s.ProgressTimeout))
	}
	if s.ParallelMigrationsPerCluster < 1 {
		errs = append(errs, fmt.Errorf("parallelMigrationsPerCluster %d: must be at least 1", s.ParallelMigrationsPerCluster))
	}
	if s.ParallelOutboundMigrationsPerNode < 1 {
		errs = append(errs, fmt.Errorf("parallelOutboundMigrationsPerNode %d: must be at least 1", s.ParallelOutboundMigrationsPerNode))
	}
	return errors.Join(errs...)
}

// With returns s with each field m sets replacing s's: the Kubevisor's
// configuration.migrations (or the live configuration's) over the flags' settings.
func (s Settings) With(m *v1alpha1.KubevisorMigrations) Settings {
	out := s
	out.BandwidthPerMigration = s.BandwidthPerMigration.DeepCopy()
	if m == nil {
		return out
	}
	if m.AllowAutoConverge != nil {
		out.AllowAutoConverge = *m.AllowAutoConverge
	}
	if m.BandwidthPerMigration != nil {
		out.BandwidthPerMigration = m.BandwidthPerMigration.DeepCopy()
	}
	if m.CompletionTimeoutPerGiB != nil {
		out.CompletionTimeoutPerGiB = *m.CompletionTimeoutPerGiB
	}
	if m.AllowPostCopy != nil {
		out.AllowPostCopy = *m.AllowPostCopy
	}
	if m.ProgressTimeout != nil {
		out.ProgressTimeout = *m.ProgressTimeout
	}
	if m.ParallelMigrationsPerCluster != nil {
		out.ParallelMigrationsPerCluster = int(*m.ParallelMigrationsPerCluster)
	}
	if m.ParallelOutboundMigrationsPerNode != nil {
		out.ParallelOutboundMigrationsPerNode = int(*m.ParallelOutboundMigrationsPerNode)
	}
	return out
}

// SettingsValue holds the cluster's migration settings while the controllers run: they Load
// it at each decision, so a Store (the live configuration, core/liveconfig) takes effect at the
// next reconcile without a restart. A nil *SettingsValue loads DefaultSettings(). It is safe
// for concurrent use.
type SettingsValue struct {
	p atomic.Pointer[Settings]
}

// NewSettingsValue returns a SettingsValue holding s, or an error when s is not valid.
func NewSettingsValue(s Settings) (*SettingsValue, error) {
	v := &SettingsValue{}
	if err := v.Store(s); err != nil {
		return nil, err
	}
	return v, nil
}

// Load returns the current settings (a copy).
func (v *SettingsValue) Load() Settings {
	if v == nil {
		return DefaultSettings()
	}
	p := v.p.Load()
	if p == nil {
		return DefaultSettings()
	}
	out := *p
	out.BandwidthPerMigration = p.BandwidthPerMigration.DeepCopy()
	return out
}

// Store replaces the settings with s when s is valid (Validate); otherwise it keeps them and
// returns why.
func (v *SettingsValue) Store(s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	s.BandwidthPerMigration = s.BandwidthPerMigration.DeepCopy()
	v.p.Store(&s)
	return nil
}

// Resolved is the outcome of Resolve.
type Resolved struct {
	// Settings are the effective settings of the VMI's migration.
	Settings Settings
	// Policy names the MigrationPolicy that applied; "" when none selected the VMI.
	Policy string
}

// Resolve returns the settings a migration of vmi runs with: defaults, each replaced by the field
// of the policy MatchPolicy picks for vmi where that policy sets it, and the policy's name.
// namespaceLabels are the labels of vmi's namespace. It is a pure function.
func Resolve(vmi *v1alpha1.VirtualMachineInstance, namespaceLabels map[string]string, policies []v1alpha1.MigrationPolicy, defaults Settings) Resolved {
	out := Resolved{Settings: defaults}
	out.Settings.BandwidthPerMigration = defaults.BandwidthPerMigration.DeepCopy()
	p := MatchPolicy(policies, vmi.Labels, namespaceLabels)
	if p == nil {
		return out
	}
	out.Policy = p.Name
	spec := p.Spec
	if spec.AllowAutoConverge != nil {
		out.Settings.AllowAutoConverge = *spec.AllowAutoConverge
	}
	if spec.BandwidthPerMigration != nil {
		out.Settings.BandwidthPerMigration = spec.BandwidthPerMigration.DeepCopy()
	}
	if spec.CompletionTimeoutPerGiB != nil {
		out.Settings.CompletionTimeoutPerGiB = *spec.CompletionTimeoutPerGiB
	}
	if spec.AllowPostCopy != nil {
		out.Settings.AllowPostCopy = *spec.AllowPostCopy
	}
	return out
}

// Configuration is r as the VMI's migrationState records it.
func (r Resolved) Configuration() (*v1alpha1.MigrationConfiguration, *string) {
	s := r.Settings
	bw := s.BandwidthPerMigration.DeepCopy()
	c := &v1alpha1.MigrationConfiguration{
		BandwidthPerMigration:   &bw,
		CompletionTimeoutPerGiB: &s.CompletionTimeoutPerGiB,
		ProgressTimeout:         &s.ProgressTimeout,
		AllowAutoConverge:       &s.AllowAutoConverge,
		AllowPostCopy:           &s.AllowPostCopy,
	}
	if r.Policy == "" {
		return c, nil
	}
	name := r.Policy
	return c, &name
}

// matchScore is how specific a policy that selects a VMI is: how many labels of its selectors
// the VMI and its namespace matched.
type matchScore struct {
	vmi, namespace int
}

// beats orders scores as KubeVirt does: more matched labels in all, then more of the VMI's own.
func (s matchScore) beats(o matchScore) bool {
	if s.vmi+s.namespace != o.vmi+o.namespace {
		return s.vmi+s.namespace > o.vmi+o.namespace
	}
	return s.vmi > o.vmi
}

// MatchPolicy returns the policy that applies to a VMI with vmiLabels in a namespace with
// namespaceLabels, nil when none selects it. The rule is KubeVirt's:
//
//   - A policy selects the VMI when every label of its virtualMachineInstanceSelector is one of
//     the VMI's labels with the same value, and every label of its namespaceSelector one of the
//     namespace's. Empty selectors select every VMI; a policy without selectors selects none.
//   - Of the policies that select the VMI, the most specific applies: the one whose selectors
//     hold the most labels in all (VMI's and namespace's together); on a tie, the one with more
//     VMI labels; on a tie again, the one whose name sorts first.
//
// Where KubeVirt skips a selector when the VMI has no labels at all (so that a VMI selector then
// matches), this function does not: a selector's label must be present, with or without others.
func MatchPolicy(policies []v1alpha1.MigrationPolicy, vmiLabels, namespaceLabels map[string]string) *v1alpha1.MigrationPolicy {
	var best *v1alpha1.MigrationPolicy
	var bestScore matchScore
	for i := range policies {
		p := &policies[i]
		score, ok := policyScore(p, vmiLabels, namespaceLabels)
		if !ok {
			continue
		}
		if best == nil || score.beats(bestScore) || (score == bestScore && p.Name < best.Name) {
			best, bestScore = p, score
		}
	}
	return best
}

// policyScore says whether p selects the VMI and, when it does, how specifically.
func policyScore(p *v1alpha1.MigrationPolicy, vmiLabels, namespaceLabels map[string]string) (matchScore, bool) {
	sel := p.Spec.Selectors
	if sel == nil {
		return matchScore{}, false
	}
	if !containsAll(vmiLabels, sel.VirtualMachineInstanceSelector) || !containsAll(namespaceLabels, sel.NamespaceSelector) {
		return matchScore{}, false
	}
	return matchScore{vmi: len(sel.VirtualMachineInstanceSelector), namespace: len(sel.NamespaceSelector)}, true
}

// containsAll says whether labels has every key of want with its value.
func containsAll(labels map[string]string, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
