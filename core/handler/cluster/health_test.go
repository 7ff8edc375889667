package cluster

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/handler"
)

// TestHealthEvents: a driver that becomes degraded or unhealthy, or says something else while it
// is, gives a Warning naming what its fingerprint says; one healthy again a Normal event; nothing
// changed, or healthy from the start, none.
func TestHealthEvents(t *testing.T) {
	const noGPU = "permittedHostDevices.pciHostDevices[0] (10de:1eb8, resource gpu): no PCI function 10de:1eb8 on this node"
	hostdev := func(health, desc string) handler.DriverHealth {
		return handler.DriverHealth{Kind: "device", Name: "hostdev", Health: health, Description: desc}
	}
	qmp := handler.DriverHealth{Kind: "hypervisor", Name: "qmp", Health: handler.HealthHealthy, Description: "QEMU 7.2"}
	steps := []struct {
		cur  []handler.DriverHealth
		want []healthEvent
	}{
		{[]handler.DriverHealth{qmp, hostdev(handler.HealthHealthy, "4 of 4 devices healthy")}, nil},
		{[]handler.DriverHealth{qmp, hostdev(handler.HealthDegraded, noGPU)}, []healthEvent{
			{corev1.EventTypeWarning, ReasonDriverDegraded, "device driver hostdev is degraded: " + noGPU}}},
		{[]handler.DriverHealth{qmp, hostdev(handler.HealthDegraded, noGPU)}, nil},
		{[]handler.DriverHealth{qmp, hostdev(handler.HealthUnhealthy, "the plugin process is not running")}, []healthEvent{
			{corev1.EventTypeWarning, ReasonDriverUnhealthy, "device driver hostdev is unhealthy: the plugin process is not running"}}},
		{[]handler.DriverHealth{qmp, hostdev(handler.HealthHealthy, "5 of 5 devices healthy")}, []healthEvent{
			{corev1.EventTypeNormal, ReasonDriverHealthy, "device driver hostdev is healthy: 5 of 5 devices healthy"}}},
	}
	var last map[string]string
	for i, s := range steps {
		var got []healthEvent
		got, last = healthEvents(last, s.cur)
		if !reflect.DeepEqual(got, s.want) {
			t.Errorf("step %d: events %+v, want %+v", i, got, s.want)
		}
	}
	// A driver degraded from the first report says so.
	got, _ := healthEvents(nil, []handler.DriverHealth{hostdev(handler.HealthDegraded, noGPU)})
	if len(got) != 1 || got[0].reason != ReasonDriverDegraded {
		t.Errorf("first report of a degraded driver: %+v", got)
	}
}
