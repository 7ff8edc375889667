package v1alpha1

import (
	"math"
	"time"

	"github.com/kubevisor/kubevisor/core/layout"
)

// GracePeriodSeconds is how long, in seconds, the guest of a VMI of this spec may take to shut
// down before it is forced: terminationGracePeriodSeconds, else layout.DefaultGracePeriod (30 s,
// a pod's default). A negative value, which the API server and the webhook reject, counts as
// unset. The launcher pod, the node agent and standalone runs all take the grace period from
// here (or from GracePeriod).
func (s *VirtualMachineInstanceSpec) GracePeriodSeconds() int64 {
	if g := s.TerminationGracePeriodSeconds; g != nil && *g >= 0 {
		return *g
	}
	return int64(layout.DefaultGracePeriod / time.Second)
}

// GracePeriod is GracePeriodSeconds as a duration, at most the longest time.Duration.
func (s *VirtualMachineInstanceSpec) GracePeriod() time.Duration {
	g := s.GracePeriodSeconds()
	if g > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(g) * time.Second
}
