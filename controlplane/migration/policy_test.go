package migration

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

type labels = v1alpha1.MigrationLabelSelector

func policy(name string, vmi, ns labels, spec v1alpha1.MigrationPolicySpec) v1alpha1.MigrationPolicy {
	spec.Selectors = &v1alpha1.MigrationPolicySelectors{VirtualMachineInstanceSelector: vmi, NamespaceSelector: ns}
	return v1alpha1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}

func TestMatchPolicy(t *testing.T) {
	vmiLabels := map[string]string{"app": "db", "tier": "gold", "zone": "a"}
	nsLabels := map[string]string{"team": "red", "env": "prod"}
	none := v1alpha1.MigrationPolicySpec{}

	for _, tc := range []struct {
		name     string
		policies []v1alpha1.MigrationPolicy
		vmi, ns  map[string]string
		want     string // "" means no policy
	}{
		{name: "no policies", vmi: vmiLabels, ns: nsLabels},
		{name: "empty selectors select every VMI",
			policies: []v1alpha1.MigrationPolicy{policy("all", nil, nil, none)}, vmi: vmiLabels, ns: nsLabels, want: "all"},
		{name: "no selectors select none",
			policies: []v1alpha1.MigrationPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "nosel"}}}, vmi: vmiLabels, ns: nsLabels},
		{name: "a VMI label with another value does not match",
			policies: []v1alpha1.MigrationPolicy{policy("p", labels{"app": "web"}, nil, none)}, vmi: vmiLabels, ns: nsLabels},
		{name: "a namespace label missing does not match",
			policies: []v1alpha1.MigrationPolicy{policy("p", labels{"app": "db"}, labels{"team": "blue"}, none)}, vmi: vmiLabels, ns: nsLabels},
		{name: "a VMI label is not looked for in the namespace",
			policies: []v1alpha1.MigrationPolicy{policy("p", labels{"team": "red"}, nil, none)}, vmi: vmiLabels, ns: nsLabels},
		{name: "a VMI without labels is not selected by a VMI selector",
			policies: []v1alpha1.MigrationPolicy{policy("p", labels{"app": "db"}, nil, none)}, vmi: nil, ns: nsLabels},
		{name: "more matched labels win",
			policies: []v1alpha1.MigrationPolicy{
				policy("a-one", labels{"app": "db"}, nil, none),
				policy("z-two", labels{"app": "db"}, labels{"team": "red"}, none),
				policy("m-zero", nil, nil, none),
			}, vmi: vmiLabels, ns: nsLabels, want: "z-two"},
		{name: "on equal totals, more VMI labels win",
			policies: []v1alpha1.MigrationPolicy{
				policy("a-ns", labels{"app": "db"}, labels{"team": "red"}, none),
				policy("b-vmi", labels{"app": "db", "tier": "gold"}, nil, none),
				policy("c-nsonly", nil, labels{"team": "red", "env": "prod"}, none),
			}, vmi: vmiLabels, ns: nsLabels, want: "b-vmi"},
		{name: "on equal scores, the first name wins whatever the order",
			policies: []v1alpha1.MigrationPolicy{
				policy("beta", labels{"zone": "a"}, nil, none),
				policy("alpha", labels{"tier": "gold"}, nil, none),
				policy("gamma", labels{"app": "db"}, nil, none),
			}, vmi: vmiLabels, ns: nsLabels, want: "alpha"},
		{name: "a more specific policy that does not match loses to one that does",
			policies: []v1alpha1.MigrationPolicy{
				policy("big", labels{"app": "db", "tier": "gold", "zone": "b"}, nil, none),
				policy("small", labels{"zone": "a"}, nil, none),
			}, vmi: vmiLabels, ns: nsLabels, want: "small"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MatchPolicy(tc.policies, tc.vmi, tc.ns)
			name := ""
			if got != nil {
				name = got.Name
			}
			if name != tc.want {
				t.Errorf("MatchPolicy = %q, want %q", name, tc.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	i64 := func(v int64) *int64 { return &v }
	defaults := Settings{BandwidthPerMigration: resource.MustParse("1Gi"), CompletionTimeoutPerGiB: 300, AllowAutoConverge: true}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "ns", Labels: map[string]string{"app": "db"}}}
	ns := map[string]string{"team": "red"}

	for _, tc := range []struct {
		name     string
		policies []v1alpha1.MigrationPolicy
		want     Resolved
	}{
		{name: "no policy: the defaults", want: Resolved{Settings: defaults}},
		{name: "a policy's fields replace the defaults, the ones it leaves out stay",
			policies: []v1alpha1.MigrationPolicy{policy("db", labels{"app": "db"}, nil, v1alpha1.MigrationPolicySpec{
				AllowPostCopy: new(true), AllowAutoConverge: new(false), BandwidthPerMigration: q("64Mi"),
			})},
			want: Resolved{Policy: "db", Settings: Settings{
				AllowPostCopy: true, AllowAutoConverge: false, BandwidthPerMigration: resource.MustParse("64Mi"), CompletionTimeoutPerGiB: 300,
			}}},
		{name: "bandwidth 0 lifts the default limit",
			policies: []v1alpha1.MigrationPolicy{policy("free", nil, labels{"team": "red"}, v1alpha1.MigrationPolicySpec{
				BandwidthPerMigration: q("0"), CompletionTimeoutPerGiB: i64(20),
			})},
			want: Resolved{Policy: "free", Settings: Settings{
				AllowAutoConverge: true, BandwidthPerMigration: resource.MustParse("0"), CompletionTimeoutPerGiB: 20,
			}}},
		{name: "only the winning policy applies",
			policies: []v1alpha1.MigrationPolicy{
				policy("broad", nil, nil, v1alpha1.MigrationPolicySpec{AllowPostCopy: new(true), CompletionTimeoutPerGiB: i64(10)}),
				policy("narrow", labels{"app": "db"}, labels{"team": "red"}, v1alpha1.MigrationPolicySpec{CompletionTimeoutPerGiB: i64(99)}),
			},
			want: Resolved{Policy: "narrow", Settings: Settings{
				AllowAutoConverge: true, BandwidthPerMigration: resource.MustParse("1Gi"), CompletionTimeoutPerGiB: 99,
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Resolve(vmi, ns, tc.policies, defaults)
			if got.Policy != tc.want.Policy {
				t.Errorf("policy = %q, want %q", got.Policy, tc.want.Policy)
			}
			g, w := got.Settings, tc.want.Settings
			if g.AllowAutoConverge != w.AllowAutoConverge || g.AllowPostCopy != w.AllowPostCopy ||
				g.CompletionTimeoutPerGiB != w.CompletionTimeoutPerGiB || g.BandwidthPerMigration.Cmp(w.BandwidthPerMigration) != 0 {
				t.Errorf("settings = %+v, want %+v", g, w)
			}
		})
	}
}

func TestSettingsValidate(t *testing.T) {
	if err := DefaultSettings().Validate(); err != nil {
		t.Errorf("DefaultSettings: %v", err)
	}
	bad := Settings{BandwidthPerMigration: resource.MustParse("-1"), CompletionTimeoutPerGiB: 0}
	err := bad.Validate()
	for _, f := range []string{"bandwidthPerMigration", "completionTimeoutPerGiB", "progressTimeout", "parallelMigrationsPerCluster", "parallelOutboundMigrationsPerNode"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("Validate = %v, want %s named", err, f)
		}
	}
}

// TestResolvedConfiguration: what the VMI's migrationState records of the resolved settings.
func TestResolvedConfiguration(t *testing.T) {
	s := DefaultSettings()
	s.BandwidthPerMigration = resource.MustParse("64Mi")
	s.AllowPostCopy = true
	c, name := Resolved{Settings: s}.Configuration()
	if name != nil {
		t.Errorf("policy name %q without a policy", *name)
	}
	if c.BandwidthPerMigration.Value() != 64<<20 || *c.CompletionTimeoutPerGiB != DefaultCompletionTimeoutPerGiB ||
		*c.ProgressTimeout != DefaultProgressTimeout || !*c.AllowPostCopy || *c.AllowAutoConverge {
		t.Errorf("configuration %+v does not hold the settings %+v", c, s)
	}
	if _, name := (Resolved{Settings: s, Policy: "databases"}).Configuration(); name == nil || *name != "databases" {
		t.Errorf("policy name %v, want databases", name)
	}
}

// TestSettingsWith: the fields a configuration sets replace the base's, the others stay.
func TestSettingsWith(t *testing.T) {
	base := DefaultSettings()
	base.BandwidthPerMigration = resource.MustParse("1Gi")
	if got := base.With(nil); got.BandwidthPerMigration.String() != "1Gi" || got.ParallelMigrationsPerCluster != DefaultParallelMigrationsPerCluster {
		t.Errorf("With(nil) = %+v, want the base", got)
	}
	per, out, bw := int32(9), int32(3), resource.MustParse("64Mi")
	got := base.With(&v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{
		BandwidthPerMigration: &bw, AllowPostCopy: new(true)}, ParallelMigrationsPerCluster: &per, ParallelOutboundMigrationsPerNode: &out})
	if got.BandwidthPerMigration.String() != "64Mi" || !got.AllowPostCopy || got.ParallelMigrationsPerCluster != 9 ||
		got.ParallelOutboundMigrationsPerNode != 3 || got.CompletionTimeoutPerGiB != DefaultCompletionTimeoutPerGiB {
		t.Errorf("With = %+v", got)
	}
	if base.BandwidthPerMigration.String() != "1Gi" {
		t.Errorf("With changed its base: %+v", base)
	}
}

// TestSettingsValue: Load returns what was stored last; an invalid Store keeps it; nil loads
// the defaults.
func TestSettingsValue(t *testing.T) {
	var none *SettingsValue
	if got := none.Load(); got.ParallelMigrationsPerCluster != DefaultParallelMigrationsPerCluster {
		t.Errorf("nil Load = %+v, want the defaults", got)
	}
	s := DefaultSettings()
	s.ParallelMigrationsPerCluster = 1
	v, err := NewSettingsValue(s)
	if err != nil {
		t.Fatal(err)
	}
	s.ParallelMigrationsPerCluster = 7
	if err := v.Store(s); err != nil || v.Load().ParallelMigrationsPerCluster != 7 {
		t.Errorf("Store 7: %v, Load %+v", err, v.Load())
	}
	s.ParallelMigrationsPerCluster = 0
	if err := v.Store(s); err == nil || v.Load().ParallelMigrationsPerCluster != 7 {
		t.Errorf("Store 0: %v, Load %+v, want refused and 7 kept", err, v.Load())
	}
}
