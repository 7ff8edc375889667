// Command kubevisor-driver-fake serves one of the simulated drivers of package drivers/fake as
// a Kubevisor driver plugin: kubevisor-driver-fake [hypervisor|network|storage|device]. With no
// argument it serves the simulated hypervisor: the handler starts the drivers of its own image
// (kubevisor-driver-<name>, handler.DriverSet.Manifests) with no argument, which is how the
// install's fake driver component (manifests/install/drivers/fake) runs it.
package main

import (
	"fmt"
	"os"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

func main() {
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: kubevisor-driver-fake [hypervisor|network|storage|device]")
		os.Exit(2)
	}
	kind := driver.KindHypervisor
	if len(os.Args) == 2 {
		kind = os.Args[1]
	}
	logger := driver.NewLogger("fake-" + kind)
	logger.Info("serving a simulated driver", "kind", kind, "version", fake.Version)
	switch kind {
	case driver.KindHypervisor:
		driver.ServeHypervisor(fake.NewHypervisor(), driver.WithLogger(logger))
	case driver.KindNetwork:
		driver.ServeNetwork(fake.NewNetwork(), driver.WithLogger(logger))
	case driver.KindStorage:
		driver.ServeStorage(fake.NewStorage(), driver.WithLogger(logger))
	case driver.KindDevice:
		driver.ServeDevice(fake.NewDevice(), driver.WithLogger(logger))
	default:
		fmt.Fprintf(os.Stderr, "kubevisor-driver-fake: unknown driver kind %q (want hypervisor, network, storage or device)\n", kind)
		os.Exit(2)
	}
}
