// Command kubevisor-driver-local is the "local" storage driver plugin: it prepares every
// volume type as a disk on the node's file system (see package drivers/storage). The host
// starts it as a go-plugin process; run by hand it prints a notice and exits.
package main

import (
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/storage"
)

func main() {
	log := driver.NewLogger(storage.DriverName)
	driver.ServeStorage(storage.New(log), driver.WithLogger(log))
}
