// Package handler is kubevisor-handler, the node agent: it loads the node's driver set as
// plugin processes (core/plugin) and runs each VMI through them, derives the VMI's status from
// the drivers' status and events, and turns the drivers' fingerprints into node labels.
//
// # Pipeline
//
// Sync runs, once per VMI (keyed by its UID): a check of the VMI against the drivers'
// capabilities, storage Prepare, network Setup in the sandbox's network namespace, device
// Allocate, the domain spec (core/domain/assemble), hypervisor Create and Start. Stop runs it in
// reverse. What a VMI has on the node is recorded in <StateDir>/vmis/<uid>.json before each
// driver call, so that a failed or interrupted sync is undone completely and a new handler
// process re-adopts the running VMs (hypervisor Recover) instead of starting them again.
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
