// Command kubevisor-driver-qmp is the QEMU hypervisor driver plugin (package drivers/qmp).
package main

import (
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

func main() {
	log := driver.NewLogger(qmp.Name)
	driver.ServeHypervisor(qmp.New(qmp.WithLogger(log)), driver.WithLogger(log))
}
