package v1alpha1

import (
	"math"
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func TestGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seconds *int64
		want    int64
	}{
		{"unset: a pod's default", nil, 30},
		{"set", ptr.To[int64](120), 120},
		{"zero: killed at once", ptr.To[int64](0), 0},
		{"negative counts as unset", ptr.To[int64](-5), 30},
		{"beyond a time.Duration", ptr.To[int64](math.MaxInt64), math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &VirtualMachineInstanceSpec{TerminationGracePeriodSeconds: tc.seconds}
			if got := s.GracePeriodSeconds(); got != tc.want {
				t.Errorf("GracePeriodSeconds() = %d, want %d", got, tc.want)
			}
			want := time.Duration(tc.want) * time.Second
			if tc.want > int64(math.MaxInt64/time.Second) {
				want = math.MaxInt64
			}
			if got := s.GracePeriod(); got != want {
				t.Errorf("GracePeriod() = %v, want %v", got, want)
			}
		})
	}
}
