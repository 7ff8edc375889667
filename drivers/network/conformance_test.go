package network

import (
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
)

// TestConformance runs the driver conformance kit's network checks across the plugin
// boundary (in-process gRPC), each VMI in a pod namespace of its own on the test node.
func TestConformance(t *testing.T) {
	requireRoot(t)
	n := newNode(t)
	d := n.newDriver(t, "")
	conformance.NetworkTesting(t, d,
		conformance.WithName(DriverName),
		conformance.WithConfig(mustJSON(n.driverConfig())),
		conformance.WithNetNS(func(t conformance.T) string { return n.newPod(t).ns }),
	)
	if c := d.dhcp.count(); c != 0 {
		t.Errorf("%d DHCP servers run after the kit's checks", c)
	}
}
