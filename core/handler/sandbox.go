package handler

import (
	"context"
	"time"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Sandbox is where a VMI's VM process lives, made and owned by the program around the handler:
// in a cluster the VMI's launcher pod (package cluster), without one a network namespace with a
// local kubevisor-launcher in it (package standalone). The handler opens it before the drivers
// set the VMI up, follows its end, and closes it once it stopped the VMI.
//
// What every implementation must do:
//   - Open waits for the sandbox to be ready and returns what it offers. The handler calls it
//     on every sync that runs the pipeline (again after a failed one); for one sandbox it must
//     return the same each time. An error means the sandbox is not ready: the sync fails with
//     SandboxNotReady and is retried by the caller.
//   - Exited returns a channel that is closed once the sandbox has ended under the VM, taking
//     the VM process with it (its launcher exited); ExitReason then says why, in words. A
//     sandbox whose end does not end the VM returns nil. Exited must not wait, and must work
//     before Open (after a handler restart the handler follows the sandbox of a running VM
//     without opening it).
//   - Close releases what the sandbox holds for the VMI. The handler calls it from Stop, once
//     the drivers undid what they made, and again from a later Stop when it failed. It must be
//     safe after the sandbox ended.
type Sandbox interface {
	Open(ctx context.Context) (SandboxSpec, error)
	Exited() <-chan struct{}
	ExitReason() string
	Close(ctx context.Context) error
}

// Sandboxes gives the handler the Sandbox of each VMI (Options.Sandboxes).
type Sandboxes interface {
	// Sandbox returns the sandbox of a VMI, or nil when it has none (its VM then runs on the
	// node, without a network namespace). It must not wait. vmi may be a stub with only a
	// name and a UID, for a VMI the handler knows from its state alone.
	Sandbox(vmi *v1alpha1.VirtualMachineInstance) Sandbox
}

// SandboxesFunc is a function as a Sandboxes.
type SandboxesFunc func(vmi *v1alpha1.VirtualMachineInstance) Sandbox

// Sandbox implements Sandboxes.
func (f SandboxesFunc) Sandbox(vmi *v1alpha1.VirtualMachineInstance) Sandbox { return f(vmi) }

// SandboxSpec is what a sandbox offers a VMI's drivers. The handler keeps it in the VMI's state,
// for the undo of its steps.
type SandboxSpec struct {
	// LauncherSocket is the launcher's unix socket; empty lets the hypervisor driver start the
	// VM process itself.
	LauncherSocket string `json:"launcherSocket,omitempty"`
	// NetNSPath is the sandbox's network namespace (/proc/PID/ns/net, /run/netns/NAME).
	NetNSPath string `json:"netnsPath,omitempty"`
	// Devices are the host devices allocated to the sandbox (kubelet device plugins), as
	// resource → device ids; the device driver's Allocate turns them into the VM's host
	// devices.
	Devices map[string][]string `json:"devices,omitempty"`
	// Dir, when set, is a directory of the node that the sandbox sees at the same path (in a
	// cluster, the launcher pod's per-VMI directory). The VMI's run directory (<Dir>/run) and
	// the storage driver's work directory (<Dir>/volumes) are then made in it, instead of in
	// Config.RunDir and Config.VolumeDir, so that every file the VM process opens by path
	// (disks, cloud-init ISOs, sockets, firmware copies) is inside the sandbox. Subdirectories,
	// not Dir itself: the handler removes them when it undoes a VMI, and Dir holds what is not
	// the handler's (the launcher's socket directory).
	Dir string `json:"dir,omitempty"`
	// HugepagesDir, when set, is a directory on a hugetlbfs of the VMI's huge page size
	// (memory.hugepages), as the VM process sees it: in a cluster the launcher pod's emptyDir
	// of medium HugePages-<size> (layout.HugepagesDir). A VMI on huge pages in a sandbox
	// without one fails with the field's path.
	HugepagesDir string `json:"hugepagesDir,omitempty"`
	// CPUs are the host CPUs the sandbox's VM process may run on (its cgroup's cpuset), in
	// increasing order: where a VMI with cpu.dedicatedCpuPlacement has its vCPUs pinned. Such a
	// VMI in a sandbox that does not say fails with the field's path.
	CPUs []uint32 `json:"cpus,omitempty"`
	// ExactCPUs says the sandbox asked for as many CPUs as its VMI's dedicated CPUs
	// (v1alpha1.DomainSpec.DedicatedCPUs), to be its own: a launcher pod of the Guaranteed QoS
	// class with whole CPUs, which the kubelet's static CPU manager gives exclusive CPUs. More
	// CPUs than that then mean they are not exclusive, and the VMI fails rather than run
	// pinned to shared CPUs.
	ExactCPUs bool `json:"exactCpus,omitempty"`
	// SELinuxLevel, when set, is the SELinux MCS level the sandbox's processes run at (in a
	// cluster, the launcher pod's securityContext.seLinuxOptions.level: package core/mcs). Where
	// the node has SELinux enabled the handler labels the files it and the drivers make for the
	// VMI in Dir with it (the directory, the run and work directories), before the VM starts.
	SELinuxLevel string `json:"selinuxLevel,omitempty"`
	// Owner, when set, is the user and group the sandbox's processes run as, when not root (in
	// a cluster, an unprivileged launcher pod's: layout.LauncherUID). The handler gives the
	// files it and the drivers make for the VMI in Dir to them (the directory, the run and work
	// directories), before the VM starts, so that the VM process can open and make what it
	// must there.
	Owner *FileOwner `json:"owner,omitempty"`
}

// FileOwner is a user and group by number.
type FileOwner struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// sandboxSettle is how long the end of a VM whose sandbox holds its process waits for the
// sandbox's end (setVM): the hypervisor driver may see the process go a moment before the
// sandbox's end is noticed, and then the sandbox's end is why the VM failed.
const sandboxSettle = 2 * time.Second

// sandboxOf returns the VMI's sandbox, taking it from Options.Sandboxes the first time and
// following its end from then on (followSandbox). Call it under the VMI's lock.
func (h *Handler) sandboxOf(e *entry, vmi *v1alpha1.VirtualMachineInstance) Sandbox {
	h.mu.Lock()
	sb := e.sandbox
	h.mu.Unlock()
	if sb != nil || h.opts.Sandboxes == nil {
		return sb
	}
	if sb = h.opts.Sandboxes.Sandbox(vmi); sb == nil {
		return nil
	}
	h.mu.Lock()
	e.sandbox = sb
	e.unfollow = make(chan struct{})
	h.mu.Unlock()
	h.followSandbox(e, sb, e.unfollow)
	return sb
}

// openSandbox opens the VMI's sandbox; a VMI without one has the zero SandboxSpec.
func (h *Handler) openSandbox(ctx context.Context, e *entry) (SandboxSpec, error) {
	h.mu.Lock()
	sb := e.sandbox
	h.mu.Unlock()
	if sb == nil {
		return SandboxSpec{}, nil
	}
	return sb.Open(ctx)
}

// followSandbox waits, in the background, for the end of the VMI's sandbox, until unfollow is
// closed (Stop) or the handler ends; then, under the VMI's lock, records it (sandboxEnded).
func (h *Handler) followSandbox(e *entry, sb Sandbox, unfollow <-chan struct{}) {
	exited := sb.Exited()
	if exited == nil {
		return
	}
	go func() {
		select {
		case <-exited:
		case <-unfollow:
			return
		case <-h.ctx.Done():
			return
		}
		unlock := h.locks.Lock(string(e.uid))
		defer unlock()
		h.sandboxEnded(e)
	}()
}

// sandboxEnded records that the VMI's sandbox ended, when it did, and publishes the VMI's
// status: a VMI whose VM was created fails with reason LauncherExited, unless it is being
// stopped (DeriveStatus). The end of the VM held for it (setVM) is let through with it. Call it
// under the VMI's lock: Stop calls it too, for an end its follower has not recorded yet.
func (h *Handler) sandboxEnded(e *entry) {
	h.mu.Lock()
	sb := e.sandbox
	if sb == nil || e.stopping || e.sandboxExited != "" || h.vmis[e.uid] != e || !chanClosed(sb.Exited()) {
		h.mu.Unlock()
		return
	}
	e.sandboxExited = orDefault(sb.ExitReason(), "the launcher exited")
	h.releaseVM(e)
	h.mu.Unlock()
	h.log.Info("sandbox ended", "uid", e.uid, "why", e.sandboxExited)
	h.publish(e)
}

// chanClosed says whether c is closed; a nil c never is.
func chanClosed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// setVM records the VM's status as the hypervisor driver reports it. Call it under h.mu.
//
// A VM that ended by itself (stopped or crashed, not by its guest's shutdown, not for a
// migration, not by Stop) while its sandbox, which holds the VM process, has not ended is held
// back for up to sandboxSettle, once: if the sandbox ends meanwhile, its end is the VM's cause
// (LauncherExited); otherwise the VM's own end then counts.
func (h *Handler) setVM(e *entry, vs *hypervisorv1.VMStatus) {
	if !h.awaitsSandbox(e, vs) {
		e.vm, e.heldVM = vs, nil
		return
	}
	e.heldVM = vs
	if e.settle == nil {
		e.settle = time.AfterFunc(sandboxSettle, func() { h.settleVM(e) })
	}
}

// awaitsSandbox says whether the VM's end in vs waits for the sandbox's (setVM).
func (h *Handler) awaitsSandbox(e *entry, vs *hypervisorv1.VMStatus) bool {
	if e.stopping || e.sandbox == nil || e.sandbox.Exited() == nil || e.sandboxExited != "" {
		return false
	}
	if e.settle != nil && e.heldVM == nil {
		return false // it waited already
	}
	switch vs.GetState() {
	case hypervisorv1.State_STATE_STOPPED, hypervisorv1.State_STATE_CRASHED:
	default:
		return false
	}
	r := vs.GetReason()
	return r != driver.ReasonGuestShutdown && r != driver.ReasonMigrated
}

// settleVM lets a held VM end through once sandboxSettle has passed.
func (h *Handler) settleVM(e *entry) {
	h.mu.Lock()
	held := e.heldVM != nil && h.vmis[e.uid] == e && h.ctx.Err() == nil
	h.releaseVM(e)
	h.mu.Unlock()
	if held {
		h.publish(e)
	}
}

// releaseVM lets the held VM status through, if any. Call it under h.mu.
func (h *Handler) releaseVM(e *entry) {
	if e.heldVM != nil {
		e.vm, e.heldVM = e.heldVM, nil
	}
	if e.settle != nil {
		e.settle.Stop()
	}
}
