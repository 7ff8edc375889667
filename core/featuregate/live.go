package featuregate

import "sync/atomic"

// Live holds the enabled set that admission reads at each request, and that the live
// configuration's applier (core/liveconfig.FeatureGates) swaps while the process runs: a
// request sees either the set before or the set after a swap, never a mix. Its methods are
// safe for concurrent use; a nil *Live holds the zero Set (no Gated gate enabled).
type Live struct {
	p atomic.Pointer[Set]
}

// NewLive returns a Live holding s.
func NewLive(s Set) *Live {
	l := &Live{}
	l.Store(s)
	return l
}

// Load returns the set held.
func (l *Live) Load() Set {
	if l == nil {
		return Set{}
	}
	if s := l.p.Load(); s != nil {
		return *s
	}
	return Set{}
}

// Store replaces the set held with s.
func (l *Live) Store(s Set) { l.p.Store(&s) }
