package featuregate

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate checks a list of gate names found at p (spec.configuration.featureGates, the live
// configuration's featureGates): each one known, none twice. Each error names the element's
// path, spec.configuration.featureGates[2], and an unknown name's error lists the known ones.
func Validate(names []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, n := range names {
		switch _, ok := Lookup(n); {
		case !ok:
			errs = append(errs, field.NotSupported(p.Index(i), n, Names()))
		case seen[n]:
			errs = append(errs, field.Duplicate(p.Index(i), n))
		}
		seen[n] = true
	}
	return errs
}

// Set is a set of enabled gates. The zero Set enables no Gated gate. A Set is a value: it is
// never changed once made.
type Set struct {
	names []string // sorted, known, each once
}

// NewSet returns the set of names, or Validate's errors (under the path "featureGates").
func NewSet(names ...string) (Set, error) {
	return newSet(names, field.NewPath("featureGates"))
}

func newSet(names []string, p *field.Path) (Set, error) {
	if errs := Validate(names, p); len(errs) > 0 {
		return Set{}, errs.ToAggregate()
	}
	s := slices.Clone(names)
	slices.Sort(s)
	return Set{names: s}, nil
}

// ParseFlag reads kubevisor-api's --feature-gates: names separated by commas (spaces around
// them ignored; "" is none).
func ParseFlag(v string) (Set, error) {
	var names []string
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return newSet(names, field.NewPath("--feature-gates"))
}

// Enabled says whether the gate name is on: listed, or GA. An unknown name is off.
func (s Set) Enabled(name string) bool {
	g, ok := Lookup(name)
	if !ok {
		return false
	}
	return g.State == GA || slices.Contains(s.names, name)
}

// Names returns the listed gates, sorted.
func (s Set) Names() []string { return slices.Clone(s.names) }

// Equal says whether s and o list the same gates.
func (s Set) Equal(o Set) bool { return slices.Equal(s.names, o.names) }

// String is the set as --feature-gates takes it.
func (s Set) String() string { return strings.Join(s.names, ",") }
