// Command kubevisor-conformance runs the Kubevisor conformance checks:
//
//	kubevisor-conformance driver --plugin PATH --kind KIND [flags]
//
// runs the driver conformance kit against a driver plugin binary, and
//
//	kubevisor-conformance vm --hypervisor PATH --storage PATH --guest-dir DIR [flags]
//
// boots the project's test guest (make guest) with a hypervisor and a storage driver plugin
// together. Both take the hypervisor from a HypervisorClass manifest instead with --class FILE:
// its driver's binary from --plugin-dir and, for vm, every launcher confined to the class's
// capabilities as in its launcher pods. See package conformance/driver/cli.
package main

import (
	"os"

	"github.com/kubevisor/kubevisor/conformance/driver/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
