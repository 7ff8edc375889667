package qmp

import (
	"strings"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// qemuShutdownReasons maps QEMU's SHUTDOWN reasons to ours.
var qemuShutdownReasons = map[string]string{
	"guest-shutdown":        driver.ReasonGuestShutdown,
	"guest-panic":           driver.ReasonGuestPanicked,
	"guest-reset":           driver.ReasonGuestReset,
	"host-qmp-quit":         "HostQuit",
	"host-qmp-system-reset": driver.ReasonHostReset,
	"host-signal":           "HostSignal",
	"host-ui":               "HostUI",
	"host-error":            "HostError",
	"subsystem-reset":       "SubsystemReset",
	"snapshot-load":         "SnapshotLoad",
}

// shutdownReason is the CamelCase reason of a QEMU SHUTDOWN reason.
func shutdownReason(qemu string) string {
	if r, ok := qemuShutdownReasons[qemu]; ok {
		return r
	}
	var b strings.Builder
	for _, part := range strings.Split(qemu, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	if b.Len() == 0 {
		return "Shutdown"
	}
	return b.String()
}

// transition is what a QMP event does to a VM in state st: the state after it and the event to
// report (EVENT_TYPE_UNSPECIFIED for none), with its reason.
func transition(st hypervisorv1.State, e qmp.Event) (hypervisorv1.State, hypervisorv1.EventType, string) {
	const none = hypervisorv1.EventType_EVENT_TYPE_UNSPECIFIED
	guest, _ := e.Data["guest"].(bool)
	switch e.Event {
	case "STOP":
		if st == hypervisorv1.State_STATE_RUNNING {
			return hypervisorv1.State_STATE_PAUSED, hypervisorv1.EventType_EVENT_TYPE_PAUSED, driver.ReasonPaused
		}
	case "RESUME":
		if st == hypervisorv1.State_STATE_PAUSED {
			return hypervisorv1.State_STATE_RUNNING, hypervisorv1.EventType_EVENT_TYPE_RESUMED, driver.ReasonResumed
		}
	case "RESET":
		reason := driver.ReasonHostReset
		if guest {
			reason = driver.ReasonGuestReset
		}
		return st, hypervisorv1.EventType_EVENT_TYPE_RESET, reason
	case "POWERDOWN":
		return st, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED, driver.ReasonPowerdownRequested
	case "SHUTDOWN":
		r, _ := e.Data["reason"].(string)
		next := hypervisorv1.State_STATE_SHUTTING_DOWN
		if st == hypervisorv1.State_STATE_CRASHED {
			next = st
		}
		return next, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, shutdownReason(r)
	case "GUEST_PANICKED":
		return hypervisorv1.State_STATE_CRASHED, hypervisorv1.EventType_EVENT_TYPE_GUEST_PANICKED, driver.ReasonGuestPanicked
	}
	return st, none, ""
}
