package liveconfig

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/kubevisor/kubevisor/core/featuregate"
)

// TestFeatureGatesField: absent is the flag's (nil), [] enables none; Marshal keeps the
// difference, which the operator's always-written [] relies on.
func TestFeatureGatesField(t *testing.T) {
	for _, c := range []struct {
		name  string
		gates []string
		want  string // in the document
	}{
		{"absent", nil, ""},
		{"none", []string{}, "featureGates: []"},
		{"some", []string{featuregate.HostDisk}, "featureGates:\n- HostDisk"},
	} {
		cfg := New()
		cfg.FeatureGates = c.gates
		data, err := cfg.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		doc := data[Key]
		if c.want == "" && strings.Contains(doc, "featureGates") || c.want != "" && !strings.Contains(doc, c.want) {
			t.Errorf("%s: document %q, want it to hold %q", c.name, doc, c.want)
		}
		got, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (got.FeatureGates == nil) != (c.gates == nil) || len(got.FeatureGates) != len(c.gates) {
			t.Errorf("%s: parsed %#v, want %#v", c.name, got.FeatureGates, c.gates)
		}
	}
}

// TestFeatureGatesApplier: each configuration swaps the set admission reads, the flag's when
// the field or the ConfigMap is absent.
func TestFeatureGatesApplier(t *testing.T) {
	base, err := featuregate.ParseFlag("HostDevices")
	if err != nil {
		t.Fatal(err)
	}
	live := featuregate.NewLive(base)
	apply := FeatureGates(live, base, logr.Discard())
	step := func(name string, gates []string, wantDisk, wantDevices bool) {
		t.Helper()
		c := New()
		c.FeatureGates = gates
		apply(c)
		s := live.Load()
		if s.Enabled(featuregate.HostDisk) != wantDisk || s.Enabled(featuregate.HostDevices) != wantDevices || !s.Enabled(featuregate.LiveMigration) {
			t.Errorf("%s: enabled %q, want HostDisk %v, HostDevices %v (and GA LiveMigration)", name, s, wantDisk, wantDevices)
		}
	}
	step("the Kubevisor's", []string{featuregate.HostDisk}, true, false)
	step("none listed", []string{}, false, false)
	step("field absent: the flag's", nil, false, true)
	step("both", []string{featuregate.HostDevices, featuregate.HostDisk}, true, true)
	// A configuration made in code that Parse would refuse leaves the set before.
	step("unknown", []string{"Nope"}, true, true)
	apply(New()) // the ConfigMap deleted: the flag's
	if s := live.Load(); !s.Equal(base) {
		t.Errorf("after New(): %q, want the flag's %q", s, base)
	}
}
