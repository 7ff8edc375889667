// Command kubevisor-driver-hostdev serves the hostdev device driver (package drivers/hostdev)
// as a Kubevisor driver plugin: the host's character devices and VFIO PCI functions.
package main

import (
	"fmt"
	"os"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/hostdev"
)

func main() {
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: kubevisor-driver-hostdev (started by a Kubevisor plugin host; configured through Configure)")
		os.Exit(2)
	}
	logger := driver.NewLogger(hostdev.Name)
	logger.Info("serving the hostdev device driver", "version", hostdev.Version)
	driver.ServeDevice(hostdev.New(logger), driver.WithLogger(logger))
}
