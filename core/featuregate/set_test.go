package featuregate

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidate(t *testing.T) {
	p := field.NewPath("spec", "configuration", "featureGates")
	for _, c := range []struct {
		name  string
		names []string
		want  string // every error in one string; "" none
	}{
		{"none", nil, ""},
		{"gated and GA", []string{HostDisk, HostDevices, LiveMigration, GPU, NUMA}, ""},
		{"unknown, with its path and the known names", []string{HostDisk, LiveMigration, "Snapshot"},
			`spec.configuration.featureGates[2]: Unsupported value: "Snapshot": supported values: "GPU", "HostDevices", "HostDisk", "LiveMigration", "NUMA"`},
		{"case matters", []string{"hostDisk"}, `spec.configuration.featureGates[0]: Unsupported value: "hostDisk"`},
		{"twice", []string{HostDisk, HostDisk}, `spec.configuration.featureGates[1]: Duplicate value: "HostDisk"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := Validate(c.names, p)
			got := ""
			if len(errs) > 0 {
				got = errs.ToAggregate().Error()
			}
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("Validate(%q) = %q, want %q", c.names, got, c.want)
			}
		})
	}
}

func TestParseFlag(t *testing.T) {
	s, err := ParseFlag(" HostDisk, LiveMigration,,HostDevices ")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); got != "HostDevices,HostDisk,LiveMigration" {
		t.Errorf("String() = %q", got)
	}
	if !s.Enabled(HostDisk) || !s.Enabled(HostDevices) || !s.Enabled(GPU) || s.Enabled("Nope") {
		t.Errorf("Enabled: %v", s)
	}
	empty, err := ParseFlag("")
	if err != nil || empty.Enabled(HostDisk) || !empty.Enabled(LiveMigration) || len(empty.Names()) != 0 {
		t.Errorf(`ParseFlag(""): %v, %v`, empty, err)
	}
	if _, err := ParseFlag("HostDisk,CPUManager"); err == nil || !strings.Contains(err.Error(), `--feature-gates[1]: Unsupported value: "CPUManager"`) {
		t.Errorf("ParseFlag of an unknown gate: %v", err)
	}
	a, _ := NewSet(HostDisk, HostDevices)
	b, _ := NewSet(HostDevices, HostDisk)
	if !a.Equal(b) || a.Equal(Set{}) {
		t.Error("Equal does not compare the gates as a set")
	}
}
