package handler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// The subdirectories of Sandbox.Dir the handler uses.
const (
	// SandboxRunDir is the VMI's run directory in Sandbox.Dir.
	SandboxRunDir = "run"
	// SandboxVolumesDir is the storage driver's work directory in Sandbox.Dir.
	SandboxVolumesDir = "volumes"
)

// undoTimeout bounds undoing a failed sync, which runs even when the sync's context is done.
const undoTimeout = 2 * time.Minute

// Sync brings a VMI to running on this node, once: it is idempotent, keyed by the VMI's UID.
//
// For a VMI the node does not run yet it runs the pipeline: check the VMI against the drivers'
// capabilities, storage Prepare, network Setup in the sandbox's network namespace, device
// Allocate (when the sandbox has devices), build the domain spec, hypervisor Create and Start.
// Each step is recorded in <StateDir>/vmis/<uid>.json before its driver is called. When a step
// fails, everything the pipeline made for the VMI is undone in reverse (hypervisor Kill and
// Delete, network Teardown, storage Release), and the status carries Synchronized=False with
// the step as its reason (Reason* constants) and the error as its message; the error is
// returned too. Other VMIs are not touched.
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
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st != nil && st.Started {
		h.observe(ctx, e)
		return h.publish(e), nil
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
	names  DriverSet
	hv     driver.Hypervisor
	net    driver.Network
	st     driver.Storage
	dev    driver.Device // nil when none is configured
	caps   driverCaps
	hvCaps *basev1.Capabilities
}

// pipelineDrivers returns the loaded drivers of a sync, or why one is missing.
func (h *Handler) pipelineDrivers() (*drivers, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := &drivers{}
	var errs []error
	need := func(kind string) string {
		name := h.loaded[kind]
		if name == "" {
			if err := h.loadErrs[kind]; err != nil {
				errs = append(errs, err)
			} else {
				errs = append(errs, fmt.Errorf("no %s driver is configured", kind))
			}
		}
		return name
	}
	d.names.Hypervisor = need(driver.KindHypervisor)
	d.names.Network = need(driver.KindNetwork)
	d.names.Storage = need(driver.KindStorage)
	d.names.Device = h.loaded[driver.KindDevice]
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
	if d.names.Device != "" {
		if d.dev, err = h.host.Device(d.names.Device); err != nil {
			return nil, err
		}
	}
	d.hvCaps = h.caps[driver.KindHypervisor]
	d.caps = driverCaps{
		hypervisor: d.names.Hypervisor, network: d.names.Network, storage: d.names.Storage,
		hypervisorCaps: d.hvCaps, networkCaps: h.caps[driver.KindNetwork], stCaps: h.caps[driver.KindStorage],
	}
	return d, nil
}

// stepError is a failed step of the pipeline.
type stepError struct {
	reason string
	err    error
}

func (e *stepError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func failed(reason string, err error) error { return &stepError{reason: reason, err: err} }

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
	var se *stepError
	if !errors.As(err, &se) {
		se = &stepError{reason: ReasonDriverNotFound, err: err}
	}
	f := &Failure{Reason: se.reason, Message: se.err.Error()}
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

// pipeline runs the steps. It returns a *stepError.
func (h *Handler) pipeline(ctx context.Context, e *entry, vmi *v1alpha1.VirtualMachineInstance) error {
	d, err := h.pipelineDrivers()
	if err != nil {
		return failed(ReasonDriverNotFound, err)
	}

	// Check the VMI before any driver is called.
	p, err := makePlan(ctx, vmi, h.opts.Resolver)
	if err != nil {
		return failed(ReasonInvalidSpec, err)
	}
	accel, _ := h.cfg.acceleration() // checked by New
	diskBus, _ := parseBus(h.cfg.DiskBus)
	cdromBus, _ := parseBus(h.cfg.CDROMBus)
	dry, err := assemble.Domain(vmi, standIns(p, accel, diskBus, cdromBus))
	if err != nil {
		return failed(ReasonInvalidSpec, err)
	}
	if err := checkSupported(vmi, dry, p, d.caps); err != nil {
		return failed(ReasonUnsupported, err)
	}
	sandbox := Sandbox{}
	if h.opts.Sandbox != nil {
		if sandbox, err = h.opts.Sandbox(ctx, vmi); err != nil {
			return failed(ReasonSandboxNotReady, err)
		}
	}
	if len(sandbox.Devices) > 0 && d.dev == nil {
		return failed(ReasonDriverNotFound, fmt.Errorf("the sandbox has devices %v but no device driver is configured", sandbox.Devices))
	}

	uid := vmi.UID
	h.mu.Lock()
	st := e.state
	if st == nil {
		st = &vmiState{
			Version: stateVersion, UID: uid, Namespace: vmi.Namespace, Name: vmi.Name, Drivers: d.names,
			WorkDir: filepath.Join(h.cfg.VolumeDir, string(uid)),
			RunDir:  filepath.Join(h.cfg.RunDir, string(uid)),
		}
		if sandbox.Dir != "" {
			st.WorkDir = filepath.Join(sandbox.Dir, SandboxVolumesDir)
			st.RunDir = filepath.Join(sandbox.Dir, SandboxRunDir)
		}
		e.state = st
	}
	st.Sandbox = sandbox
	h.mu.Unlock()
	save := func() error { return h.states.save(st) }
	if err := save(); err != nil {
		return failed(ReasonStorageFailed, err)
	}

	// Storage.
	h.begin(st, stepStorage, nil)
	if err := save(); err != nil {
		return failed(ReasonStorageFailed, err)
	}
	prep, err := d.st.Prepare(ctx, &storagev1.PrepareRequest{VmiId: string(uid), WorkDir: st.WorkDir, Volumes: p.volumes})
	if err != nil {
		return failed(ReasonStorageFailed, err)
	}
	disks := map[string]*storagev1.PreparedDisk{}
	for _, dk := range prep.GetDisks() {
		disks[dk.GetVolumeName()] = dk
	}

	// Network.
	setupReq := &networkv1.SetupRequest{VmiId: string(uid), NetnsPath: sandbox.NetNSPath, Interfaces: p.interfaces}
	h.begin(st, stepNetwork, func() { st.Network = marshalProto(setupReq) })
	if err := save(); err != nil {
		return failed(ReasonNetworkFailed, err)
	}
	setup, err := d.net.Setup(ctx, setupReq)
	if err != nil {
		return failed(ReasonNetworkFailed, err)
	}
	h.mu.Lock()
	st.NetworkResult = marshalProto(setup)
	h.mu.Unlock()
	if err := save(); err != nil {
		return failed(ReasonNetworkFailed, err)
	}
	ifaces := map[string]*networkv1.InterfaceResult{}
	for _, r := range setup.GetInterfaces() {
		ifaces[r.GetName()] = r
	}

	// Devices.
	var hostDevices []*domainv1.HostDevice
	if len(sandbox.Devices) > 0 {
		h.begin(st, stepDevices, nil)
		if err := save(); err != nil {
			return failed(ReasonDeviceFailed, err)
		}
		resources := make([]string, 0, len(sandbox.Devices))
		for r := range sandbox.Devices {
			resources = append(resources, r)
		}
		sort.Strings(resources)
		for _, r := range resources {
			resp, err := d.dev.Allocate(ctx, &devicev1.AllocateRequest{Resource: r, DeviceIds: sandbox.Devices[r]})
			if err != nil {
				return failed(ReasonDeviceFailed, fmt.Errorf("resource %q: %w", r, err))
			}
			for i, pci := range resp.GetPciAddresses() {
				hostDevices = append(hostDevices, &domainv1.HostDevice{Name: fmt.Sprintf("%s-%d", r, i), PciAddress: pci})
			}
		}
	}

	// Domain spec.
	in := assemble.Inputs{
		Disks: disks, Interfaces: ifaces, HostDevices: hostDevices, RunDir: st.RunDir,
		Sandbox:      &domainv1.Sandbox{LauncherSocket: sandbox.LauncherSocket, NetnsPath: sandbox.NetNSPath},
		Acceleration: accel, Kernel: p.kernel, DiskBus: diskBus, CDROMBus: cdromBus,
	}
	spec, err := assemble.Domain(vmi, in)
	if err != nil {
		return failed(ReasonDomainFailed, err)
	}

	// Hypervisor.
	if err := os.MkdirAll(st.RunDir, 0o700); err != nil {
		return failed(ReasonCreateFailed, err)
	}
	h.begin(st, stepHypervisor, nil)
	if err := save(); err != nil {
		return failed(ReasonCreateFailed, err)
	}
	handle, err := d.hv.Create(ctx, spec)
	if status.Code(err) == codes.AlreadyExists {
		// Left by a sync that was interrupted before it saved the handle, and never started
		// (Started is saved right after Start): make it again from this spec.
		h.log.Info("VM exists from an interrupted sync: deleting it", "uid", uid)
		if kerr := d.hv.Kill(ctx, string(uid)); kerr != nil && status.Code(kerr) != codes.NotFound {
			return failed(ReasonCreateFailed, kerr)
		}
		if derr := d.hv.Delete(ctx, string(uid)); derr != nil {
			return failed(ReasonCreateFailed, derr)
		}
		handle, err = d.hv.Create(ctx, spec)
	}
	if err != nil {
		return failed(ReasonCreateFailed, err)
	}
	if handle == nil {
		handle = &hypervisorv1.Handle{Id: string(uid), Driver: d.names.Hypervisor}
	}
	h.mu.Lock()
	st.Handle = marshalProto(handle)
	h.mu.Unlock()
	if err := save(); err != nil {
		return failed(ReasonCreateFailed, err)
	}
	if err := d.hv.Start(ctx, string(uid)); err != nil {
		return failed(ReasonStartFailed, err)
	}
	h.mu.Lock()
	st.Started = true
	h.mu.Unlock()
	if err := save(); err != nil {
		// The VM runs; the handler forgets it on restart only if this write was lost.
		h.log.Error("VM started but its state was not saved", "uid", uid, "error", err)
	}
	h.observe(ctx, e)
	return nil
}

// begin records that a step begins (and what then changes in st), under the lock that
// publish reads the state under.
func (h *Handler) begin(st *vmiState, step string, change func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st.begin(step)
	if change != nil {
		change()
	}
}

// standIns are build inputs with a stand-in for every driver result, so that Domain reports
// the VMI's own problems before any driver is called.
func standIns(p *plan, accel domainv1.Acceleration, diskBus, cdromBus domainv1.DiskBus) assemble.Inputs {
	in := assemble.Inputs{
		Disks:        map[string]*storagev1.PreparedDisk{},
		Interfaces:   map[string]*networkv1.InterfaceResult{},
		RunDir:       "/stand-in",
		Acceleration: accel, Kernel: p.kernel, DiskBus: diskBus, CDROMBus: cdromBus,
	}
	for _, v := range p.volumes {
		in.Disks[v.GetName()] = &storagev1.PreparedDisk{VolumeName: v.GetName(), Path: "/stand-in/" + v.GetName()}
	}
	for _, i := range p.interfaces {
		in.Interfaces[i.GetName()] = &networkv1.InterfaceResult{Name: i.GetName(), TapName: "tap0", Mac: "02:00:00:00:00:01"}
	}
	if in.Kernel != nil && in.Kernel.KernelPath == "" {
		in.Kernel = &assemble.KernelArtifacts{KernelPath: "/stand-in/kernel"}
	}
	return in
}

// undo removes what the pipeline made for e's VMI, in reverse order, then its run directory,
// work directory and state. It keeps the state (with what is left) when a driver fails.
func (h *Handler) undo(ctx context.Context, e *entry) error {
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	id := string(st.UID)
	var errs []error
	remaining := slices.Clone(st.Steps)
	for i := len(st.Steps) - 1; i >= 0; i-- {
		var err error
		switch st.Steps[i] {
		case stepHypervisor:
			err = h.removeVM(ctx, st)
		case stepNetwork:
			var n driver.Network
			if n, err = h.host.Network(st.Drivers.Network); err == nil {
				req := st.setupRequest()
				err = n.Teardown(ctx, &networkv1.TeardownRequest{VmiId: id, NetnsPath: req.GetNetnsPath(), Interfaces: req.GetInterfaces()})
			}
		case stepStorage:
			var s driver.Storage
			if s, err = h.host.Storage(st.Drivers.Storage); err == nil {
				err = s.Release(ctx, &storagev1.ReleaseRequest{VmiId: id, WorkDir: st.WorkDir})
			}
		case stepDevices:
			// The device contract has no release: allocations end with the sandbox.
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", st.Steps[i], err))
			continue
		}
		remaining = slices.Delete(remaining, i, i+1)
	}
	if len(errs) > 0 {
		h.mu.Lock()
		st.Steps = remaining
		h.mu.Unlock()
		if err := h.states.save(st); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
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

// hypervisorFor returns the hypervisor driver a VMI was set up with, and its capabilities.
func (h *Handler) hypervisorFor(st *vmiState) (driver.Hypervisor, *basev1.Capabilities, error) {
	h.mu.Lock()
	name := h.loaded[driver.KindHypervisor]
	caps := h.caps[driver.KindHypervisor]
	h.mu.Unlock()
	if st != nil && st.Drivers.Hypervisor != "" && st.Drivers.Hypervisor != name {
		return nil, nil, fmt.Errorf("the VMI runs on hypervisor driver %q, which this handler does not load (it loads %q)", st.Drivers.Hypervisor, name)
	}
	if name == "" {
		return nil, nil, errors.New("no hypervisor driver is loaded")
	}
	hv, err := h.host.Hypervisor(name)
	return hv, caps, err
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
	e.vm = vs
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
// stopped). When a driver fails the state is kept and a later Stop goes on where this one
// stopped.
func (h *Handler) Stop(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, grace time.Duration) (v1alpha1.VirtualMachineInstanceStatus, error) {
	if vmi == nil || vmi.UID == "" {
		return v1alpha1.VirtualMachineInstanceStatus{}, errors.New("stop: the VMI has no UID")
	}
	unlock := h.locks.Lock(string(vmi.UID))
	defer unlock()
	e := h.entryFor(vmi)
	h.mu.Lock()
	st := e.state
	e.stopping = true
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
	status = h.publish(e)
	h.mu.Lock()
	delete(h.vmis, vmi.UID)
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
		e.vm = vs
		h.mu.Unlock()
	}
	return nil
}
