// Command kubevisor-driver-libvirt is the libvirt hypervisor driver plugin (package drivers/libvirt).
package main

import (
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/libvirt"
)

func main() {
	log := driver.NewLogger(libvirt.Name)
	driver.ServeHypervisor(libvirt.New(libvirt.WithLogger(log)), driver.WithLogger(log))
}
