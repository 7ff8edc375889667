// Command hostpath-storage is an example out-of-tree Kubevisor storage driver named "hostpath".
// It turns emptyDisk and hostDisk volumes into raw disk images on the node's filesystem.
//
// It is started by the host as a go-plugin process; run by hand it prints a notice and exits.
// See README.md for how to build, test and install it.
package main

import "github.com/kubevisor/kubevisor/core/driver"

func main() {
	log := driver.NewLogger(DriverName)
	driver.ServeStorage(New(log), driver.WithLogger(log))
}
