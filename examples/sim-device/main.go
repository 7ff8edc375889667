// Command sim-device is an example out-of-tree Kubevisor device driver named "sim". It offers
// simulated devices of one resource, example-sim (devices.kubevisor.io/example-sim on a node),
// which hand a container an environment variable naming them, and no device node.
//
// It is started by the host as a go-plugin process; run by hand it prints a notice and exits.
// See README.md for how to build, test and install it.
package main

import "github.com/kubevisor/kubevisor/core/driver"

func main() {
	log := driver.NewLogger(DriverName)
	driver.ServeDevice(New(log), driver.WithLogger(log))
}

// What the driver implements, checked at compile time: the device contract and its optional
// Watch (declared in Capabilities as FEATURE_DEVICE_WATCH).
var (
	_ driver.Device        = (*Sim)(nil)
	_ driver.DeviceWatcher = (*Sim)(nil)
)
