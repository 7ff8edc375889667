package handler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

// The subdirectories of Sandbox.Dir the handler uses.
const (
	// SandboxRunDir is the VMI's run directory in Sandbox.Dir.
	SandboxRunDir = "run"
	// SandboxVolumesDir is the storage driver's work directory in Sandbox.Dir.
	SandboxVolumesDir = "volumes"
)

// undoTimeout bounds undoing a failed sync, which runs even when the sync's context is done,
// and closing a stopped VMI's sandbox.
const undoTimeout = 2 * time.Minute

// Sync brings a VMI to running on this node, once: it is idempotent, keyed by the VMI's UID.
//
// For a VMI the node does not run yet it runs the pipeline: check the VMI against the drivers'
// capabilities, open its sandbox (Options.Sandboxes), then the steps of syncSteps: storage
// Prepare, network Setup in the sandbox's network namespace, device Allocate (when the sandbox
// has devices), build the domain spec, hypervisor Create and Start. Each step that makes
// something is recorded in <StateDir>/vmis/<uid>.json before its driver is called. When a step
// fails, everything the pipeline made for the VMI is undone in reverse (hypervisor Kill and
// Delete, network Teardown, storage Release), and the status carries Synchronized=False with
// the failure's cause as its reason (Reason* constants: the failed step for a driver's error,
// ReasonInternal for the handler's own) and the error as its message; the error is returned
// too. Other VMIs are not touched.
//
// For a VMI whose VM was started it starts nothing: it asks the hypervisor driver for the VM
// (re-adopting it with Recover when the driver does not know it, after a driver or handler
// restart) and returns the status. A VM that stopped is not started again.
func (h *Handler) Sync(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (v1alpha1.VirtualMachineInstanceStatus, error) {
	if vmi == nil || vmi.UID == "" {
		return v1alpha1.VirtualMachineInstanceStatus{}, errors.New("sync: the VMI has no UID")
	}
	if h.isClosed() {
		return v1alpha1.VirtualMachineInstanceStatus{}, errors.New("sync: the handler is closed")
	}
	unlock := h.locks.Lock(string(vmi.UID))
	defer unlock()
	e := h.entryFor(vmi)
	h.sandboxOf(e, vmi)
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st != nil && st.Started {
		h.observe(ctx, e)
		h.incomingDone(e)
		return h.publish(e), nil
	}
	if st != nil && st.Incoming != "" {
		// A target whose VM is not created yet (a failed SyncIncoming left it): only the
		// target's side (SyncIncoming) goes on with it.
		return h.publish(e), fmt.Errorf("sync VMI %s: it waits to migrate in (migration %s)", vmiName(vmi), st.Incoming)
	}
	err := h.run(ctx, e, vmi)
	return h.publish(e), err
}

func (h *Handler) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// entryFor returns the VMI's entry, made if needed, with vmi as its last seen VMI.
func (h *Handler) entryFor(vmi *v1alpha1.VirtualMachineInstance) *entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.vmis[vmi.UID]
	if e == nil {
		e = &entry{uid: vmi.UID}
		h.vmis[vmi.UID] = e
	}
	e.vmi = vmi.DeepCopy()
	return e
}

// drivers is what one sync uses.
type drivers struct {
	names DriverSet
	hv    driver.Hypervisor
	net   driver.Network
	st    driver.Storage
	// devs are the loaded device drivers by name, devFor the one that lists each resource,
	// devTwice why a resource has none (two list it), devUnloaded the configured device drivers
	// that are not loaded (the resources they would list are unknown).
	devs        map[string]driver.Device
	devFor      map[string]string
	devTwice    map[string]error
	devUnloaded []error
	caps        driverCaps
	hvCaps      *basev1.Capabilities
}

// HypervisorDriverOf is the hypervisor driver that runs vmi on a node whose default hypervisor
// driver is def: the driver of the VMI's HypervisorClass (status.hypervisorDriver, which the
// control plane writes when it resolves the class), else def (a standalone VMI, or one the
// control plane made before it wrote the driver).
func HypervisorDriverOf(vmi *v1alpha1.VirtualMachineInstance, def string) string {
	if vmi != nil && vmi.Status.HypervisorDriver != "" {
		return vmi.Status.HypervisorDriver
	}
	return def
}

// pipelineDrivers returns the loaded drivers of a sync of vmi (its hypervisor driver:
// HypervisorDriverOf), or why one is missing.
func (h *Handler) pipelineDrivers(vmi *v1alpha1.VirtualMachineInstance) (*drivers, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := &drivers{}
	var errs []error
	need := func(kind, name string) string {
		if name == "" {
			errs = append(errs, fmt.Errorf("no %s driver is configured", kind))
			return ""
		}
		if h.loaded[name] == "" {
			if err := h.loadErrs[name]; err != nil {
				errs = append(errs, err)
			} else {
				errs = append(errs, fmt.Errorf("%s driver %q is not loaded", kind, name))
			}
			return ""
		}
		return name
	}
	hvName := HypervisorDriverOf(vmi, h.cfg.Drivers.DefaultHypervisor())
	if hvName != "" && !slices.Contains(h.cfg.Drivers.HypervisorNames(), hvName) {
		errs = append(errs, fmt.Errorf("the VMI's hypervisor driver %q is not one this node runs (it runs %s)",
			hvName, quotedList(h.cfg.Drivers.HypervisorNames())))
	} else {
		d.names.Hypervisor = need(driver.KindHypervisor, hvName)
	}
	d.names.Network = need(driver.KindNetwork, h.cfg.Drivers.Network)
	d.names.Storage = need(driver.KindStorage, h.cfg.Drivers.Storage)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var err error
	if d.hv, err = h.host.Hypervisor(d.names.Hypervisor); err != nil {
		return nil, err
	}
	if d.net, err = h.host.Network(d.names.Network); err != nil {
		return nil, err
	}
	if d.st, err = h.host.Storage(d.names.Storage); err != nil {
		return nil, err
	}
	if err := h.deviceDrivers(d); err != nil {
		return nil, err
	}
	d.hvCaps = h.caps[d.names.Hypervisor]
	d.caps = driverCaps{
		hypervisor: d.names.Hypervisor, network: d.names.Network, storage: d.names.Storage,
		hypervisorCaps: d.hvCaps, networkCaps: h.caps[d.names.Network], stCaps: h.caps[d.names.Storage],
	}
	return d, nil
}

// deviceDrivers fills in d's device drivers: every configured device driver that is loaded,
// and which of them lists each resource (Capabilities.resources). A resource two drivers list
// is an error naming both, for the VMIs whose sandbox has it (routeDevices); so is a configured
// device driver that is not loaded, as the resources it would list are unknown. h.mu is held.
func (h *Handler) deviceDrivers(d *drivers) error {
	d.devs, d.devFor, d.devTwice = map[string]driver.Device{}, map[string]string{}, map[string]error{}
	listedBy := map[string][]string{}
	var names []string
	for _, name := range h.cfg.Drivers.DeviceNames() {
		if h.loaded[name] == "" {
			err := h.loadErrs[name]
			if err == nil {
				err = fmt.Errorf("device driver %q is not loaded", name)
			}
			d.devUnloaded = append(d.devUnloaded, err)
			continue
		}
		dev, err := h.host.Device(name)
		if err != nil {
			return err
		}
		d.devs[name] = dev
		names = append(names, name)
		for _, res := range h.caps[name].GetResources() {
			if !slices.Contains(listedBy[res], name) {
				listedBy[res] = append(listedBy[res], name)
			}
		}
	}
	for res, by := range listedBy {
		if len(by) == 1 {
			d.devFor[res] = by[0]
		} else {
			d.devTwice[res] = fmt.Errorf("resource %q is listed by device drivers %s: one device driver per resource", res, quotedList(by))
		}
	}
	d.names = d.names.withDevices(names)
	return nil
}

// routeDevices checks that every device resource of the sandbox has the one device driver
// that allocates it (drivers.devFor), and records the drivers used in the VMI's driver names.
func (d *drivers) routeDevices(devices map[string][]string) error {
	var errs []error
	var used []string
	missing := false
	for _, res := range slices.Sorted(maps.Keys(devices)) {
		name, ok := d.devFor[res]
		if err := d.devTwice[res]; err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			errs = append(errs, fmt.Errorf("resource %q: no loaded device driver lists it (loaded: %s)", res, quotedList(d.names.DeviceNames())))
			missing = true
			continue
		}
		if !slices.Contains(used, name) {
			used = append(used, name)
		}
	}
	if missing {
		errs = append(errs, d.devUnloaded...)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// The VMI's device drivers, in the node's configured order.
	d.names = d.names.withDevices(slices.DeleteFunc(d.names.DeviceNames(), func(n string) bool { return !slices.Contains(used, n) }))
	return nil
}

// quotedList is names quoted and joined with commas, or "none".
func quotedList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// run runs the pipeline for a VMI that has no started VM, and undoes it when a step fails.
func (h *Handler) run(ctx context.Context, e *entry, vmi *v1alpha1.VirtualMachineInstance) error {
	h.publish(e) // Scheduled: the handler has taken the VMI over
	err := h.pipeline(ctx, e, vmi)
	if err == nil {
		h.mu.Lock()
		e.failure = nil
		h.mu.Unlock()
		h.log.Info("VMI started", "vmi", vmiName(vmi), "uid", vmi.UID)
		return nil
	}
	// Every failure of the pipeline has its reason; any other is the handler's own.
	re := classify(ReasonInternal, err)
	f := &Failure{Reason: re.reason, Message: re.err.Error()}
	if uerr := h.undo(ctx, e); uerr != nil {
		f.Message += "; undoing the sync failed, the handler retries on the next sync or Stop: " + uerr.Error()
	}
	h.mu.Lock()
	e.failure = f
	h.mu.Unlock()
	h.log.Warn("VMI sync failed", "vmi", vmiName(vmi), "uid", vmi.UID, "reason", f.Reason, "message", f.Message)
	return fmt.Errorf("sync VMI %s: %s: %s", vmiName(vmi), f.Reason, f.Message)
}

func vmiName(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Namespace == "" {
		return vmi.Name
	}
	return vmi.Namespace + "/" + vmi.Name
}

// pipeline checks the VMI, opens its sandbox and runs the sync steps. Its error carries the
// failure's reason.
func (h *Handler) pipeline(ctx context.Context, e *entry, vmi *v1alpha1.VirtualMachineInstance) error {
	tl := &Timeline{Start: time.Now()}
	r, err := h.newSyncRun(ctx, e, vmi)
	if err != nil {
		return err
	}
	tl.mark(timelineChecks, time.Now())
	r.timeline = tl
	if err := h.runSteps(ctx, r, syncSteps); err != nil {
		return err
	}
	h.mu.Lock()
	e.timeline = tl
	h.mu.Unlock()
	h.log.Info("VMI synced", "vmi", vmiName(vmi), "uid", vmi.UID, "timeline", tl.Note())
	h.observe(ctx, e)
	return nil
}

// syncRun is one run of the sync steps for a VMI: what the checks before them found, and what
// each step leaves for the next.
type syncRun struct {
	h       *Handler
	e       *entry
	vmi     *v1alpha1.VirtualMachineInstance
	st      *vmiState
	d       *drivers
	p       *plan
	sandbox SandboxSpec

	accel             domainv1.Acceleration
	diskBus, cdromBus domainv1.DiskBus

	disks       map[string]*storagev1.PreparedDisk    // by volume: storage Prepare's
	ifaces      map[string]*networkv1.InterfaceResult // by interface: network Setup's
	hostDevices []*domainv1.HostDevice                // device Allocate's
	spec        *domainv1.DomainSpec

	timeline *Timeline // the steps' times, when the pipeline keeps them
}

// newSyncRun checks a VMI before anything is made for it on the node (the drivers it needs are
// loaded, its spec is consistent and asks only for what they declare, its sandbox is ready) and
// makes its state, or takes up the one a failed sync left. Its error carries the reason.
func (h *Handler) newSyncRun(ctx context.Context, e *entry, vmi *v1alpha1.VirtualMachineInstance) (*syncRun, error) {
	d, err := h.pipelineDrivers(vmi)
	if err != nil {
		return nil, failed(ReasonDriverNotFound, err)
	}
	p, err := makePlan(ctx, vmi, h.opts.Resolver)
	if err != nil {
		return nil, failed(ReasonInvalidSpec, err)
	}
	r := &syncRun{h: h, e: e, vmi: vmi, d: d, p: p}
	r.accel, _ = h.cfg.acceleration() // checked by New
	r.diskBus, _ = parseBus(h.cfg.DiskBus)
	r.cdromBus, _ = parseBus(h.cfg.CDROMBus)
	dry, err := assemble.Domain(vmi, standIns(p, r.accel, r.diskBus, r.cdromBus))
	if err != nil {
		return nil, failed(ReasonInvalidSpec, err)
	}
	if err := checkSupported(vmi, dry, p, d.caps); err != nil {
		return nil, failed(ReasonUnsupported, err)
	}
	if r.sandbox, err = h.openSandbox(ctx, e); err != nil {
		return nil, failed(ReasonSandboxNotReady, err)
	}
	if len(r.sandbox.Devices) > 0 && len(h.cfg.Drivers.DeviceNames()) == 0 {
		return nil, failed(ReasonDriverNotFound, fmt.Errorf("the sandbox has devices %v but no device driver is configured", r.sandbox.Devices))
	}
	if err := d.routeDevices(r.sandbox.Devices); err != nil {
		return nil, failed(ReasonDriverNotFound, err)
	}
	r.st = h.stateFor(e, vmi, d.names, r.sandbox)
	return r, nil
}

// stateFor returns the VMI's state with the sandbox it runs in, made when the node has none
// yet. The first step saves it.
func (h *Handler) stateFor(e *entry, vmi *v1alpha1.VirtualMachineInstance, names DriverSet, sandbox SandboxSpec) *vmiState {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := e.state
	if st == nil {
		st = &vmiState{
			Version: stateVersion, UID: vmi.UID, Namespace: vmi.Namespace, Name: vmi.Name, Drivers: names,
			WorkDir: filepath.Join(h.cfg.VolumeDir, string(vmi.UID)),
			RunDir:  filepath.Join(h.cfg.RunDir, string(vmi.UID)),
		}
		if sandbox.Dir != "" {
			st.WorkDir = filepath.Join(sandbox.Dir, SandboxVolumesDir)
			st.RunDir = filepath.Join(sandbox.Dir, SandboxRunDir)
		}
		if e.incoming != nil {
			st.Incoming = e.incoming.MigrationUID
		}
		e.state = st
	}
	st.Sandbox = sandbox
	return st
}

// standIns are build inputs with a stand-in for every driver result (assemble.StandIns), so
// that Domain reports the VMI's own problems before any driver is called.
func standIns(p *plan, accel domainv1.Acceleration, diskBus, cdromBus domainv1.DiskBus) assemble.Inputs {
	var volumes, interfaces []string
	for _, v := range p.volumes {
		volumes = append(volumes, v.GetName())
	}
	for _, i := range p.interfaces {
		interfaces = append(interfaces, i.GetName())
	}
	in := assemble.StandIns(volumes, interfaces)
	in.Acceleration, in.DiskBus, in.CDROMBus = accel, diskBus, cdromBus
	if p.kernel != nil && p.kernel.KernelPath != "" {
		in.Kernel = p.kernel
	}
	return in
}

// undo removes what the pipeline made for e's VMI, in reverse order (undoSteps), then its run
// directory, work directory and state. It keeps the state (with what is left) when a driver
// fails.
func (h *Handler) undo(ctx context.Context, e *entry) error {
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	left, err := h.undoSteps(ctx, st, syncSteps)
	if err != nil {
		h.mu.Lock()
		st.Steps = left
		h.mu.Unlock()
		if serr := h.states.save(st); serr != nil {
			err = errors.Join(err, serr)
		}
		return err
	}
	var errs []error
	if err := os.RemoveAll(st.RunDir); err != nil {
		errs = append(errs, fmt.Errorf("remove run directory: %w", err))
	}
	if err := os.Remove(st.WorkDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		h.log.Warn("work directory not empty after Release: left in place", "dir", st.WorkDir, "error", err)
	}
	if err := h.states.remove(st.UID); err != nil {
		errs = append(errs, err)
	}
	h.mu.Lock()
	e.state = nil
	h.mu.Unlock()
	return errors.Join(errs...)
}

// The steps' do and undo (syncSteps).

// prepareStorage is storage Prepare of the VMI's volumes.
func (r *syncRun) prepareStorage(ctx context.Context) error {
	prep, err := r.d.st.Prepare(ctx, &storagev1.PrepareRequest{VmiId: string(r.vmi.UID), WorkDir: r.st.WorkDir, Volumes: r.p.volumes})
	if err != nil {
		return err
	}
	r.disks = map[string]*storagev1.PreparedDisk{}
	for _, dk := range prep.GetDisks() {
		r.disks[dk.GetVolumeName()] = dk
	}
	return nil
}

// releaseStorage is storage Release of the VMI's work directory.
func (h *Handler) releaseStorage(ctx context.Context, st *vmiState) error {
	s, err := h.host.Storage(st.Drivers.Storage)
	if err != nil {
		return err
	}
	return s.Release(ctx, &storagev1.ReleaseRequest{VmiId: string(st.UID), WorkDir: st.WorkDir})
}

// setupNetwork is network Setup of the VMI's interfaces in the sandbox's network namespace. The
// request is recorded before the call, for Teardown, and the result after it, for the status.
func (r *syncRun) setupNetwork(ctx context.Context) error {
	req := &networkv1.SetupRequest{VmiId: string(r.vmi.UID), NetnsPath: r.sandbox.NetNSPath, Interfaces: r.p.interfaces, Hostname: r.vmi.GuestHostname()}
	if o := r.sandbox.Owner; o != nil {
		req.SandboxUser = &networkv1.SandboxUser{Uid: uint32(o.UID), Gid: uint32(o.GID)}
	}
	if err := r.record(func(st *vmiState) { st.Network = marshalProto(req) }); err != nil {
		return err
	}
	setup, err := r.d.net.Setup(ctx, req)
	if err != nil {
		return err
	}
	if err := r.record(func(st *vmiState) { st.NetworkResult = marshalProto(setup) }); err != nil {
		return err
	}
	r.ifaces = map[string]*networkv1.InterfaceResult{}
	for _, i := range setup.GetInterfaces() {
		r.ifaces[i.GetName()] = i
	}
	return nil
}

// teardownNetwork is network Teardown of what Setup was asked for.
func (h *Handler) teardownNetwork(ctx context.Context, st *vmiState) error {
	n, err := h.host.Network(st.Drivers.Network)
	if err != nil {
		return err
	}
	req := st.setupRequest()
	return n.Teardown(ctx, &networkv1.TeardownRequest{VmiId: string(st.UID), NetnsPath: req.GetNetnsPath(), Interfaces: req.GetInterfaces()})
}

// noDevices says the sandbox has no devices to allocate.
func (r *syncRun) noDevices() bool { return len(r.sandbox.Devices) == 0 }

// allocateDevices is device Allocate of the sandbox's devices, by resource in name order, each
// by the device driver that lists the resource (routeDevices), and the domain's host devices
// from the answers (hostDevices).
func (r *syncRun) allocateDevices(ctx context.Context) error {
	for _, res := range slices.Sorted(maps.Keys(r.sandbox.Devices)) {
		name := r.d.devFor[res]
		ids := r.sandbox.Devices[res]
		resp, err := r.d.devs[name].Allocate(ctx, &devicev1.AllocateRequest{Resource: res, DeviceIds: ids})
		if err != nil {
			return fmt.Errorf("resource %q (device driver %q): %w", res, name, err)
		}
		r.hostDevices = append(r.hostDevices, hostDevices(res, name, ids, vmiDeviceNames(r.vmi, res), resp)...)
	}
	return nil
}

// hostDevices are the domain's host devices of one resource, which device driver drv allocated
// (ids, answering resp) for the VMI's devices names of that resource (vmiDeviceNames):
//   - a PCI function per pci_address, named after the VMI's devices in order ("<res>-<i>" past
//     them);
//   - without pci_addresses, one host device per VMI device, whatever the driver gave: the
//     device nodes and environment the hypervisor needs to know the device by. A resource the
//     VMI names no device of (the class's kvm and tun, which the sandbox itself uses) gives none.
//
// The ids go one to each host device, in order, when there are as many (a PCI function whose
// address is one of the ids gets that one); otherwise each host device has them all.
func hostDevices(res, drv string, ids, names []string, resp *devicev1.AllocateResponse) []*domainv1.HostDevice {
	n := len(resp.GetPciAddresses())
	if n == 0 {
		n = len(names)
	}
	var nodes []*domainv1.HostDeviceNode
	for _, dn := range resp.GetDeviceNodes() {
		nodes = append(nodes, &domainv1.HostDeviceNode{Path: dn.GetContainerPath(), HostPath: dn.GetHostPath(), Permissions: dn.GetPermissions()})
	}
	var out []*domainv1.HostDevice
	for i := range n {
		hd := &domainv1.HostDevice{Name: fmt.Sprintf("%s-%d", res, i), Resource: res, DeviceDriver: drv, DeviceIds: slices.Clone(ids)}
		if i < len(names) {
			hd.Name = names[i]
		}
		if len(ids) == n {
			hd.DeviceIds = []string{ids[i]}
		}
		if i < len(resp.GetPciAddresses()) {
			hd.PciAddress = resp.GetPciAddresses()[i]
			if slices.Contains(ids, hd.PciAddress) {
				hd.DeviceIds = []string{hd.PciAddress} // a function whose id is its address
			}
		}
		for _, dn := range nodes {
			hd.DeviceNodes = append(hd.DeviceNodes, proto.CloneOf(dn))
		}
		if len(resp.GetEnv()) > 0 {
			hd.Env = maps.Clone(resp.GetEnv())
		}
		out = append(out, hd)
	}
	return out
}

// vmiDeviceNames are the names of the VMI's gpus[], then hostDevices[], allocated from the
// device driver's resource res (deviceName devices.kubevisor.io/<res>), in order: the domain's
// host devices of that resource take them in the order of the driver's pci_addresses.
func vmiDeviceNames(vmi *v1alpha1.VirtualMachineInstance, res string) []string {
	var names []string
	want := v1alpha1.DeviceResourcePrefix + res
	for _, g := range vmi.Spec.Domain.Devices.GPUs {
		if g.DeviceName == want {
			names = append(names, g.Name)
		}
	}
	for _, h := range vmi.Spec.Domain.Devices.HostDevices {
		if h.DeviceName == want {
			names = append(names, h.Name)
		}
	}
	return names
}

// buildDomain builds the domain spec from the VMI and the drivers' results, and the VM's
// persistent state directory from the Resolver when the VMI keeps state beyond its life.
func (r *syncRun) buildDomain(ctx context.Context) error {
	in := assemble.Inputs{
		Disks: r.disks, Interfaces: r.ifaces, HostDevices: r.hostDevices, RunDir: r.st.RunDir,
		Sandbox:      &domainv1.Sandbox{LauncherSocket: r.sandbox.LauncherSocket, NetnsPath: r.sandbox.NetNSPath},
		Acceleration: r.accel, Kernel: r.p.kernel, DiskBus: r.diskBus, CDROMBus: r.cdromBus,
		HugepagesDir: r.sandbox.HugepagesDir,
		CPUs:         r.sandbox.CPUs, ExactCPUs: r.sandbox.ExactCPUs,
	}
	if r.vmi.Spec.NeedsPersistentState() {
		// Asked for here, once the VMI passed checkSupported and its sandbox is open (in a
		// cluster the directory is the launcher pod's claim), so that nothing is made for a VMI
		// whose driver would refuse it.
		dir, err := r.h.opts.Resolver.PersistentState(ctx, r.vmi)
		if err != nil {
			return failed(ReasonDomainFailed, fmt.Errorf("%s: %w", persistentStateField(r.vmi), err))
		}
		in.PersistentStateDir = dir
	}
	if r.vmi.Spec.Domain.NUMAPassthrough() {
		nodes, err := hostNUMANodes("/sys")
		if err != nil {
			return failed(ReasonDomainFailed, fmt.Errorf("spec.domain.cpu.numa.guestMappingPassthrough: the node's NUMA nodes: %w", err))
		}
		in.HostNUMANodes = nodes
	}
	spec, err := assemble.Domain(r.vmi, in)
	if err != nil {
		return failed(ReasonDomainFailed, err)
	}
	if r.st.Incoming != "" {
		r.h.mu.Lock()
		postCopy := r.e.incoming != nil && r.e.incoming.AllowPostCopy
		r.h.mu.Unlock()
		spec.IncomingMigration = &domainv1.IncomingMigration{SocketPath: filepath.Join(r.st.RunDir, IncomingSocketName), AllowPostCopy: postCopy}
		if disks := MigratedDisks(r.vmi); len(disks) > 0 {
			spec.IncomingMigration.DisksSocketPath = filepath.Join(r.st.RunDir, IncomingDisksSocketName)
			for _, d := range disks {
				spec.IncomingMigration.Disks = append(spec.IncomingMigration.Disks, d.GetName())
			}
		}
	}
	r.spec = spec
	return nil
}

// persistentStateField is the field by which vmi asks for persistent state: its TPM's, else
// its EFI firmware's.
func persistentStateField(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Spec.PersistentTPM() {
		return "spec.domain.devices.tpm.persistent"
	}
	return "spec.domain.firmware.bootloader.efi.persistent"
}

// createVM is hypervisor Create of the VM in its run directory; its handle is recorded, for
// Recover.
func (r *syncRun) createVM(ctx context.Context) error {
	if err := os.MkdirAll(r.st.RunDir, 0o700); err != nil {
		return internal(fmt.Errorf("make the run directory: %w", err))
	}
	hv, id := r.d.hv, string(r.vmi.UID)
	handle, err := hv.Create(ctx, r.spec)
	if status.Code(err) == codes.AlreadyExists {
		// Left by a sync that was interrupted before it saved the handle, and never started
		// (Started is saved right after Start): make it again from this spec.
		r.h.log.Info("VM exists from an interrupted sync: deleting it", "uid", id)
		if kerr := hv.Kill(ctx, id); kerr != nil && status.Code(kerr) != codes.NotFound {
			return kerr
		}
		if derr := hv.Delete(ctx, id); derr != nil {
			return derr
		}
		handle, err = hv.Create(ctx, r.spec)
	}
	if err != nil {
		return err
	}
	if handle == nil {
		handle = &hypervisorv1.Handle{Id: id, Driver: r.d.names.Hypervisor}
	}
	return r.record(func(st *vmiState) { st.Handle = marshalProto(handle) })
}

// noSELinux says there is nothing to label: the sandbox has no SELinux level, or the node has
// SELinux disabled.
func (r *syncRun) noSELinux() bool {
	return r.sandbox.SELinuxLevel == "" || !r.h.opts.SELinux.Enabled()
}

// labelFiles labels what the node made for the VMI in its sandbox directory with the sandbox's
// SELinux level, so that the VM process, which runs at that level, can open it and no other
// VMI's process can: the directory itself (not what is beneath: the launcher's own directory,
// and mounts of claims and containerDisk images, which the runtime labels as the pod's), the
// storage driver's work directory (overlays, emptyDisk images, cloud-init media) and the run
// directory (what hypervisor Create made there; the VM process's sockets are made at its level).
func (r *syncRun) labelFiles(context.Context) error {
	level, err := mcs.ParseLevel(r.sandbox.SELinuxLevel)
	if err != nil {
		return failed(ReasonSELinuxLabelFailed, fmt.Errorf("the sandbox's %w", err))
	}
	for _, p := range []struct {
		path    string
		recurse bool
	}{{r.sandbox.Dir, false}, {r.st.WorkDir, true}, {r.st.RunDir, true}} {
		if p.path == "" {
			continue
		}
		if err := r.h.opts.SELinux.Label(level, p.path, p.recurse); err != nil {
			return failed(ReasonSELinuxLabelFailed, err)
		}
	}
	return nil
}

// LabelFiles labels path, and with recurse everything beneath it, which the program around the
// handler made for VMI uid in its sandbox directory (in a cluster the console log and the guest
// probe socket), with the sandbox's SELinux level, as the sync labels the files it makes. It
// does nothing where the node has SELinux disabled, or the VMI has no level on this node.
func (h *Handler) LabelFiles(uid types.UID, path string, recurse bool) error {
	if !h.opts.SELinux.Enabled() {
		return nil
	}
	h.mu.Lock()
	var s string
	if e := h.vmis[uid]; e != nil && e.state != nil {
		s = e.state.Sandbox.SELinuxLevel
	}
	h.mu.Unlock()
	if s == "" {
		return nil
	}
	level, err := mcs.ParseLevel(s)
	if err != nil {
		return fmt.Errorf("the sandbox's %w", err)
	}
	return h.opts.SELinux.Label(level, path, recurse)
}

// startVM is hypervisor Start. From then on the handler never starts the VM again (Started).
func (r *syncRun) startVM(ctx context.Context) error {
	id := string(r.vmi.UID)
	if err := r.d.hv.Start(ctx, id); err != nil {
		return err
	}
	if err := r.record(func(st *vmiState) { st.Started = true }); err != nil {
		// The VM runs; the handler forgets it on restart only if this write was lost.
		r.h.log.Error("VM started but its state was not saved", "uid", id, "error", err)
	}
	r.h.kickAgents()
	return nil
}

// removeVM kills and deletes a VM, re-adopting it first when its driver does not know it.
func (h *Handler) removeVM(ctx context.Context, st *vmiState) error {
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		return err
	}
	id := string(st.UID)
	err = hv.Kill(ctx, id)
	if status.Code(err) == codes.NotFound {
		if _, rerr := h.recoverVM(ctx, hv, st); rerr == nil {
			err = hv.Kill(ctx, id)
		}
	}
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("kill VM: %w", err)
	}
	if err := hv.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete VM: %w", err)
	}
	return nil
}

// hypervisorFor returns the hypervisor driver a VMI was set up with (its state's; the node's
// default hypervisor driver for a state that names none, or for no state), with its name and
// capabilities.
func (h *Handler) hypervisorFor(st *vmiState) (driver.Hypervisor, *basev1.Capabilities, error) {
	hv, _, caps, err := h.namedHypervisorFor(st)
	return hv, caps, err
}

// hypervisorName is the name of the hypervisor driver of a VMI's state (hypervisorFor's).
func (h *Handler) hypervisorName(st *vmiState) string {
	if st != nil && st.Drivers.Hypervisor != "" {
		return st.Drivers.Hypervisor
	}
	return h.cfg.Drivers.DefaultHypervisor()
}

func (h *Handler) namedHypervisorFor(st *vmiState) (driver.Hypervisor, string, *basev1.Capabilities, error) {
	name := h.hypervisorName(st)
	if name == "" {
		return nil, "", nil, errors.New("no hypervisor driver is configured")
	}
	h.mu.Lock()
	loaded := h.loaded[name] == driver.KindHypervisor
	caps, loadErr := h.caps[name], h.loadErrs[name]
	h.mu.Unlock()
	if !loaded {
		switch {
		case loadErr != nil:
			return nil, name, nil, fmt.Errorf("the VMI runs on hypervisor driver %q, which is not loaded: %w", name, loadErr)
		case !slices.Contains(h.cfg.Drivers.HypervisorNames(), name):
			return nil, name, nil, fmt.Errorf("the VMI runs on hypervisor driver %q, which this handler does not load (it loads %s)",
				name, quotedList(h.cfg.Drivers.HypervisorNames()))
		default:
			return nil, name, nil, fmt.Errorf("the VMI runs on hypervisor driver %q, which is not loaded", name)
		}
	}
	hv, err := h.host.Hypervisor(name)
	return hv, name, caps, err
}

// observe asks the hypervisor driver for a started VM's status, re-adopting the VM when the
// driver does not know it. When the driver cannot be reached what is known stays.
func (h *Handler) observe(ctx context.Context, e *entry) {
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st == nil || !st.began(stepHypervisor) {
		return
	}
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		h.log.Warn("cannot observe VM", "uid", st.UID, "error", err)
		return
	}
	vs, err := hv.Status(ctx, string(st.UID))
	if status.Code(err) == codes.NotFound {
		vs, err = h.recoverVM(ctx, hv, st)
	}
	if err != nil {
		h.log.Debug("VM status unknown", "uid", st.UID, "error", err)
		return
	}
	h.mu.Lock()
	h.setVM(e, vs)
	h.mu.Unlock()
}

// recoverVM re-adopts a VM from its handle (Recover), or reports it gone when the driver
// cannot recover VMs.
func (h *Handler) recoverVM(ctx context.Context, hv driver.Hypervisor, st *vmiState) (*hypervisorv1.VMStatus, error) {
	handle := st.handle()
	r, ok := driver.Optional[driver.Recoverer](ctx, hv)
	if handle == nil || !ok {
		return &hypervisorv1.VMStatus{Id: string(st.UID), State: hypervisorv1.State_STATE_STOPPED, Reason: driver.ReasonProcessGone,
			Message: "the hypervisor driver does not know the VM and cannot recover it"}, nil
	}
	vs, err := r.Recover(ctx, handle)
	if err == nil {
		h.log.Info("VM recovered", "uid", st.UID, "state", vs.GetState().String(), "boots", vs.GetBoots())
	}
	return vs, err
}

// Stop stops a VMI on this node and removes everything the pipeline made for it: hypervisor
// Shutdown (grace is the guest's time to power off before it is forced), Delete, network
// Teardown, storage Release, then its directories and state. It is idempotent: Stop of a VMI
// the node does not run succeeds. It returns the VMI's last status (Succeeded once its VM
// stopped), or Failed with LauncherExited when its sandbox had ended under it. Last it closes the
// VMI's sandbox. When a driver fails the state is kept and a later Stop goes on where this one
// stopped.
func (h *Handler) Stop(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, grace time.Duration) (v1alpha1.VirtualMachineInstanceStatus, error) {
	if vmi == nil || vmi.UID == "" {
		return v1alpha1.VirtualMachineInstanceStatus{}, errors.New("stop: the VMI has no UID")
	}
	unlock := h.locks.Lock(string(vmi.UID))
	defer unlock()
	e := h.entryFor(vmi)
	sb := h.sandboxOf(e, vmi)
	h.sandboxEnded(e) // an end its follower, waiting for the VMI's lock, has not recorded
	h.mu.Lock()
	st := e.state
	e.stopping = true
	h.releaseVM(e)
	h.mu.Unlock()
	if st != nil && st.began(stepHypervisor) {
		if err := h.shutdown(ctx, e, st, grace); err != nil {
			return h.publish(e), fmt.Errorf("stop VMI %s: %w", vmiName(vmi), err)
		}
	}
	status := h.publish(e)
	if err := h.undo(ctx, e); err != nil {
		return status, fmt.Errorf("stop VMI %s: %w", vmiName(vmi), err)
	}
	if sb != nil {
		// Like undo, even when ctx is done: what the VMI had on the node is gone but the sandbox.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		err := sb.Close(cctx)
		cancel()
		if err != nil {
			return status, fmt.Errorf("stop VMI %s: close its sandbox: %w", vmiName(vmi), err)
		}
	}
	status = h.publish(e)
	h.mu.Lock()
	delete(h.vmis, vmi.UID)
	if e.unfollow != nil {
		close(e.unfollow)
	}
	h.mu.Unlock()
	h.log.Info("VMI stopped", "vmi", vmiName(vmi), "uid", vmi.UID, "phase", status.Phase)
	return status, nil
}

// shutdown powers a VM off gracefully within grace (forced after it) and records its last
// status.
func (h *Handler) shutdown(ctx context.Context, e *entry, st *vmiState, grace time.Duration) error {
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		return err
	}
	id := string(st.UID)
	_, err = hv.Shutdown(ctx, id, grace)
	if status.Code(err) == codes.NotFound {
		if _, rerr := h.recoverVM(ctx, hv, st); rerr != nil {
			return fmt.Errorf("recover VM: %w", rerr)
		}
		_, err = hv.Shutdown(ctx, id, grace)
	}
	if err != nil && status.Code(err) != codes.NotFound {
		h.log.Warn("graceful shutdown failed: killing the VM", "uid", id, "error", err)
		if kerr := hv.Kill(ctx, id); kerr != nil && status.Code(kerr) != codes.NotFound {
			return fmt.Errorf("shutdown: %w; kill: %w", err, kerr)
		}
	}
	if vs, err := hv.Status(ctx, id); err == nil {
		h.mu.Lock()
		h.setVM(e, vs)
		h.mu.Unlock()
	}
	return nil
}
