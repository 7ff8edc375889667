package qmp

import (
	"github.com/kubevisor/kubevisor/core/driver"
	"testing"

	"github.com/digitalocean/go-qemu/qmp"

	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

func TestTransition(t *testing.T) {
	const (
		running  = hypervisorv1.State_STATE_RUNNING
		paused   = hypervisorv1.State_STATE_PAUSED
		shutting = hypervisorv1.State_STATE_SHUTTING_DOWN
		crashed  = hypervisorv1.State_STATE_CRASHED
		none     = hypervisorv1.EventType_EVENT_TYPE_UNSPECIFIED
	)
	ev := func(name string, data map[string]any) qmp.Event { return qmp.Event{Event: name, Data: data} }
	cases := []struct {
		from   hypervisorv1.State
		event  qmp.Event
		to     hypervisorv1.State
		typ    hypervisorv1.EventType
		reason string
	}{
		{running, ev("STOP", nil), paused, hypervisorv1.EventType_EVENT_TYPE_PAUSED, driver.ReasonPaused},
		{paused, ev("STOP", nil), paused, none, ""},
		{shutting, ev("STOP", nil), shutting, none, ""},
		{paused, ev("RESUME", nil), running, hypervisorv1.EventType_EVENT_TYPE_RESUMED, driver.ReasonResumed},
		{running, ev("RESUME", nil), running, none, ""},
		{running, ev("RESET", map[string]any{"guest": true, "reason": "guest-reset"}), running, hypervisorv1.EventType_EVENT_TYPE_RESET, driver.ReasonGuestReset},
		{running, ev("RESET", map[string]any{"guest": false, "reason": "host-qmp-system-reset"}), running, hypervisorv1.EventType_EVENT_TYPE_RESET, driver.ReasonHostReset},
		{running, ev("POWERDOWN", nil), running, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED, driver.ReasonPowerdownRequested},
		{running, ev("SHUTDOWN", map[string]any{"guest": true, "reason": "guest-shutdown"}), shutting, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, driver.ReasonGuestShutdown},
		{running, ev("SHUTDOWN", map[string]any{"guest": false, "reason": "host-qmp-quit"}), shutting, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, "HostQuit"},
		{running, ev("SHUTDOWN", map[string]any{"guest": false, "reason": "some-new-reason"}), shutting, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, "SomeNewReason"},
		{running, ev("GUEST_PANICKED", map[string]any{"action": "pause"}), crashed, hypervisorv1.EventType_EVENT_TYPE_GUEST_PANICKED, driver.ReasonGuestPanicked},
		{crashed, ev("SHUTDOWN", map[string]any{"guest": true, "reason": "guest-panic"}), crashed, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, driver.ReasonGuestPanicked},
		{running, ev("RTC_CHANGE", nil), running, none, ""},
	}
	for _, c := range cases {
		to, typ, reason := transition(c.from, c.event)
		if to != c.to || typ != c.typ || reason != c.reason {
			t.Errorf("%s + %s %v = %s %s %q, want %s %s %q", c.from, c.event.Event, c.event.Data, to, typ, reason, c.to, c.typ, c.reason)
		}
	}
}
