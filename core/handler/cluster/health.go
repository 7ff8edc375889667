package cluster

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/handler"
)

// HealthSource gives the health of the node's drivers with their fingerprints' descriptions
// (handler.Handler does).
type HealthSource interface {
	DriverHealth() []handler.DriverHealth
}

// Reasons of the Node events on drivers' health (NodeLabeler.Events).
const (
	// ReasonDriverDegraded: a driver works with something missing, which the event says (a
	// permittedHostDevices entry of the hostdev driver that selects no device, KVM not usable).
	ReasonDriverDegraded = "DriverDegraded"
	// ReasonDriverUnhealthy: a driver cannot serve, or is not running.
	ReasonDriverUnhealthy = "DriverUnhealthy"
	// ReasonDriverHealthy: a driver that was degraded or unhealthy is healthy again.
	ReasonDriverHealthy = "DriverHealthy"
)

// actionDriverHealth is the action of the health events.
const actionDriverHealth = "Fingerprint"

// healthEvent is one Node event on a driver's health.
type healthEvent struct {
	eventType, reason, note string
}

// healthEvents returns the events of a change of the drivers' health from prev (the last
// health and description reported, by kind/name) to cur, and the state to pass next time: a
// Warning when a driver becomes degraded or unhealthy or says something else while it is, a
// Normal event when it becomes healthy again. A driver healthy from the start says nothing.
func healthEvents(prev map[string]string, cur []handler.DriverHealth) ([]healthEvent, map[string]string) {
	next := map[string]string{}
	var out []healthEvent
	for _, d := range cur {
		key := d.Kind + "/" + d.Name
		state := d.Health + ": " + d.Description
		next[key] = state
		before, seen := prev[key]
		if seen && before == state {
			continue
		}
		what := d.Kind + " driver " + d.Name
		switch d.Health {
		case handler.HealthHealthy:
			if seen && !healthy(before) {
				out = append(out, healthEvent{corev1.EventTypeNormal, ReasonDriverHealthy, what + " is healthy: " + d.Description})
			}
		case handler.HealthDegraded:
			out = append(out, healthEvent{corev1.EventTypeWarning, ReasonDriverDegraded, what + " is degraded: " + d.Description})
		default:
			out = append(out, healthEvent{corev1.EventTypeWarning, ReasonDriverUnhealthy, what + " is unhealthy: " + d.Description})
		}
	}
	return out, next
}

func healthy(state string) bool {
	return len(state) >= len(handler.HealthHealthy)+1 && state[:len(handler.HealthHealthy)+1] == handler.HealthHealthy+":"
}

// healthReporter records healthEvents on the Node.
type healthReporter struct {
	events recorder.EventRecorder
	last   map[string]string
}

// report records the events of the drivers' health since the last report on node.
func (r *healthReporter) report(node *corev1.Node, src HealthSource) {
	if r == nil || r.events == nil || src == nil {
		return
	}
	evs, next := healthEvents(r.last, src.DriverHealth())
	r.last = next
	for _, e := range evs {
		r.events.Eventf(node, nil, e.eventType, e.reason, actionDriverHealth, "%s", e.note)
	}
}
