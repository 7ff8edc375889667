// Command kubevisor-bench measures Kubevisor against plain QEMU:
//
//	kubevisor-bench boot [--runs N] [--guest-dir DIR] [--vms N,M] [--driver qmp=PATH] [--driver libvirt=PATH]
//
// times the test guest's boot to its console marker with raw qemu-system-x86_64, through the
// qmp driver plugin and through the libvirt one, and reads the drivers' memory per running VM
// beyond QEMU (libvirt's per-VM daemon counted);
//
//	kubevisor-bench memory [--vms 1,5,10] [--guest-dir DIR] [--bin-dir DIR] [--vmi FILE]
//
// boots VMs through the node handler, each with its own launcher and sandbox, and prints the
// memory per VM of QEMU, the launcher, and the handler's and drivers' shares;
//
//	kubevisor-bench controlplane [--vmis 1000] [--clients N] [--controller-workers N]
//
// creates VMIs against a real API server with kubevisor-controller's manager in the process and
// prints the rate at which they become launcher pods and the control plane's API requests per
// VMI;
//
//	kubevisor-bench e2e [--kubeconfig FILE] [--vmis 20] [--console file|logs]
//
// creates VMIs of the test guest at once on a cluster where Kubevisor is installed, from its
// node, and prints the P50/P95 of creation to Running and to the console marker, the memory per
// VM on the node beyond QEMU, and the API requests per VMI counted by the API server;
//
//	kubevisor-bench console-latency [--kubeconfig FILE] [--chars N] [--vnc-runs N] [--cert-dir DIR]
//
// boots one VMI there and prints the p50/p99 of keystroke to echo on its serial console through
// the API server (vmctl console's path) and straight to the node handler's stream endpoint, their
// ratio, and the time from opening vnc to the first FramebufferUpdate on both paths;
//
//	kubevisor-bench migrate [--kubeconfig FILE] [--rounds 3] [--modes idle,dirty] [--raw-only]
//
// live-migrates the test guest, idle and dirtying its memory, with raw QEMU to QEMU over a unix
// socket and through Kubevisor on a two-node cluster, alternating, and prints QEMU's total time
// and downtime, the guest's heartbeat gap seen from the host, the medians and the ratios
// Kubevisor/raw. See package hack/bench.
package main

import (
	"os"

	"github.com/kubevisor/kubevisor/hack/bench"
)

func main() {
	os.Exit(bench.Run(os.Args[1:], os.Stdout, os.Stderr))
}
