package liveconfig

import (
	"flag"
	"strconv"

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
