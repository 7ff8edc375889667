package liveconfig

import (
	"flag"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
)

// Verbosity returns an Applier that sets v, a klog verbosity flag (textlogger.Config's
// Verbosity(), which its logger reads at each call), to what pick returns from a
// configuration, or back to v's value at the time of this call (the -v flag) when pick
// returns nil.
func Verbosity(v flag.Value, pick func(Config) *int32, log logr.Logger) Applier {
	base := v.String()
	return func(c Config) {
		want := base
		if p := pick(c); p != nil {
			want = strconv.Itoa(int(*p))
		}
		if v.String() == want {
			return
		}
		if err := v.Set(want); err != nil {
			log.Error(err, "set log verbosity", "verbosity", want)
			return
		}
		log.Info("log verbosity set", "verbosity", want)
	}
}

// ControllerVerbosity picks kubevisor-controller's verbosity.
func ControllerVerbosity(c Config) *int32 {
	if c.LogVerbosity == nil {
		return nil
	}
	return c.LogVerbosity.Controller
}

// APIVerbosity picks kubevisor-api's verbosity.
func APIVerbosity(c Config) *int32 {
	if c.LogVerbosity == nil {
		return nil
	}
	return c.LogVerbosity.API
}

// LockedValue is a flag.Value whose String and Set are serialised. klog's verbosity is read
// atomically by the logger that checks it, but its String is not: whoever reads it while a
// watcher sets it (a test, a debug endpoint) must go through a LockedValue given to Verbosity.
type LockedValue struct {
	mu sync.Mutex
	// Value is the flag value wrapped.
	Value flag.Value
}

// String is the wrapped value's String.
func (l *LockedValue) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Value.String()
}

// Set is the wrapped value's Set.
func (l *LockedValue) Set(s string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Value.Set(s)
}
