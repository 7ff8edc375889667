// Package handler is kubevisor-handler, the node agent: it loads the node's driver set as
// plugin processes (core/plugin) and runs each VMI through them, derives the VMI's status from
// the drivers' status and events, and turns the drivers' fingerprints into node labels.
//
// # Pipeline
//
// Sync runs, once per VMI (keyed by its UID): a check of the VMI against the drivers'
// capabilities, the opening of its sandbox, then the sync's steps, a list of {name, reason, do,
// undo} run by one runner (steps.go): storage Prepare, network Setup in the sandbox's network
// namespace, device Allocate, the domain spec (core/domain/assemble), hypervisor Create and
// Start. Stop runs the undos in reverse.
//
// # Device drivers
//
// A node runs any number of device drivers (DriverSet.Devices; the handler.d parts' device
// drivers add up). Each device resource of a VMI's sandbox is allocated by the one device driver
// that lists it in its capabilities; a resource two drivers list, or none, fails the VMI with
// DriverNotFound naming them, before anything is made. The answers become the domain spec's
// host devices, named after the VMI's hostDevices[] and gpus[], with the resource, device ids,
// device nodes and environment, so that a device with no PCI address reaches the hypervisor
// driver by name. The drivers' fingerprints become node labels, and a driver that becomes
// degraded or unhealthy a Warning event on the Node (package cluster). What a VMI has on the node is recorded in
// <StateDir>/vmis/<uid>.json before each driver call, so that a failed or interrupted sync is
// undone completely, from that record alone, and a new handler process re-adopts the running VMs
// (hypervisor Recover) instead of starting them again. A failed sync's reason says whose
// failure it was: the VMI's, the sandbox's, a driver's (the step's) or the handler's own.
//
// # Sandbox
//
// A VMI's VM process lives in a Sandbox that the program around the handler makes and gives it
// (Options.Sandboxes): the launcher pod in a cluster, a local launcher in a network namespace
// without one. The handler opens it before the steps, follows its end (a sandbox that ends
// under the VM fails the VMI with LauncherExited) and closes it when it stops the VMI.
//
// # Recovery
//
// The hypervisor driver's event stream ends whenever its plugin process does (the connection
// from core/plugin survives restarts; streams do not). The handler reopens it, then re-adopts
// every started VM from its handle. While the driver is away a VMI keeps the status it had:
// a driver restart never fails a VMI.
//
// # Standalone
//
// Package core/handler/standalone runs one VMI from a manifest without a cluster
// (kubevisor-handler run -f vmi.yaml).
package handler
