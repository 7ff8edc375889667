package launcher

import (
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		grace, margin, wantMargin time.Duration
	}{
		{30 * time.Second, 0, 5 * time.Second},
		{10 * time.Second, 0, 2 * time.Second},
		{0, 0, 0},
		{2 * time.Second, 3 * time.Second, 2 * time.Second}, // never more than the grace period
		{30 * time.Second, time.Second, time.Second},
	} {
		c, err := Config{Dir: "vmi", GracePeriod: tc.grace, KillMargin: tc.margin}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if c.KillMargin != tc.wantMargin || c.GracePeriod != tc.grace || c.Logger == nil || c.Dir[0] != '/' {
			t.Errorf("grace %s margin %s: got %+v, want margin %s", tc.grace, tc.margin, c, tc.wantMargin)
		}
	}
	for _, bad := range []Config{{}, {Dir: "d", GracePeriod: -time.Second}, {Dir: "d", KillMargin: -time.Second}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
