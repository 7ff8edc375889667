package featuregate

import (
	"slices"
	"testing"
)

// TestTable: KubeVirt's names, each Gated gate with its rule, the GA ones always on.
func TestTable(t *testing.T) {
	want := map[string]State{HostDisk: Gated, HostDevices: Gated, GPU: GA, LiveMigration: GA, NUMA: GA}
	if got := Names(); !slices.Equal(got, []string{GPU, HostDevices, HostDisk, LiveMigration, NUMA}) {
		t.Errorf("Names() = %q", got)
	}
	for _, g := range Gates() {
		if want[g.Name] != g.State {
			t.Errorf("gate %s: state %s, want %s", g.Name, g.State, want[g.Name])
		}
		if g.Feature == "" {
			t.Errorf("gate %s: no feature", g.Name)
		}
		if g.State == Gated && !slices.ContainsFunc(rules, func(r rule) bool { return r.gate == g.Name }) {
			t.Errorf("gated gate %s has no rule in check.go: it would change nothing", g.Name)
		}
		if g.State == GA && !(Set{}).Enabled(g.Name) {
			t.Errorf("GA gate %s is not enabled in the empty set", g.Name)
		}
		if g.State == Gated && (Set{}).Enabled(g.Name) {
			t.Errorf("gated gate %s is enabled in the empty set", g.Name)
		}
	}
	for _, r := range rules {
		if _, ok := Lookup(r.gate); !ok {
			t.Errorf("rule of unknown gate %s", r.gate)
		}
	}
	if _, ok := Lookup("hostdisk"); ok {
		t.Error("Lookup is case-insensitive, want KubeVirt's exact names")
	}
}
