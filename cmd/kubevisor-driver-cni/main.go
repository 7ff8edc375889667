// Command kubevisor-driver-cni is the "cni" network driver plugin: KubeVirt's bridge and
// masquerade bindings in the sandbox's network namespace, and secondary networks from CNI
// network lists (see package drivers/network). The host starts it as a go-plugin process; run
// by hand it prints a notice and exits.
package main

import (
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/network"
)

func main() {
	log := driver.NewLogger(network.DriverName)
	driver.ServeNetwork(network.New(log), driver.WithLogger(log))
}
