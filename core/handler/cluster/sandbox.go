package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/mcs"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// podSandbox is a VMI's launcher pod as the handler's Sandbox. Open finds the launcher (its
// socket in the per-VMI directory, and its network namespace through the pid of the process
// serving that socket), mounts the VMI's containerDisk disks and the claims of its
// persistentVolumeClaim and ephemeral volumes (podClaims) into the per-VMI directory and has
// the handler keep the VMI's files there (SandboxSpec.Dir), where the launcher container sees
// them at the same path. The agent ends it (end) when it sees the pod, or its launcher
// container, end under a VMI that is not being stopped. Close releases those mounts (and the
// persistent state's, podResolver.PersistentState).
type podSandbox struct {
	a   *Agent
	vmi *v1alpha1.VirtualMachineInstance

	exited chan struct{}
	mu     sync.Mutex
	why    string // set before exited is closed
}

var _ handler.Sandbox = (*podSandbox)(nil)

// sandbox returns the VMI's podSandbox, made the first time; the handler takes it through
// Options.Sandboxes, and Reconcile to end it.
func (a *Agent) sandbox(vmi *v1alpha1.VirtualMachineInstance) *podSandbox {
	a.mu.Lock()
	defer a.mu.Unlock()
	sb := a.sandboxes[vmi.UID]
	if sb == nil {
		sb = &podSandbox{a: a, vmi: vmi.DeepCopy(), exited: make(chan struct{})}
		a.sandboxes[vmi.UID] = sb
	}
	return sb
}

// Open implements handler.Sandbox.
func (s *podSandbox) Open(ctx context.Context) (handler.SandboxSpec, error) {
	cfg := s.a.cfg
	// The per-VMI directory is the launcher pod's: bound from the kubelet's directory of it
	// first, the launcher's socket is there.
	owner, err := s.a.bindVMIDir(ctx, s.vmi)
	if err != nil {
		return handler.SandboxSpec{}, err
	}
	socket := filepath.Join(layout.LauncherDir(cfg.HostStateDir, s.vmi.UID), launcher.SocketName)
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	c, err := launcher.Dial(dctx, socket)
	if err != nil {
		return handler.SandboxSpec{}, err
	}
	defer c.Close()
	pid := c.LauncherPid()
	if pid <= 0 {
		return handler.SandboxSpec{}, fmt.Errorf("launcher at %s: its pid is not visible from the handler (the handler needs the host's pid namespace)", socket)
	}
	// The devices of the VMI's gpus[] and hostDevices[] the kubelet allocated to the pod (the
	// device driver's Allocate turns them into the domain's host devices), asked before
	// anything is mounted, so that a failure leaves nothing behind.
	var devices map[string][]string
	if len(vmiDeviceResources(s.vmi)) > 0 {
		pod, err := s.a.launcherPod(ctx, s.vmi)
		if err != nil {
			return handler.SandboxSpec{}, err
		}
		if devices, err = podDevices(ctx, cfg.PodResourcesSocket, s.vmi, pod); err != nil {
			return handler.SandboxSpec{}, fmt.Errorf("launcher pod's devices: %w", err)
		}
	}
	level, err := s.a.selinuxLevel(ctx, s.vmi)
	if err != nil {
		return handler.SandboxSpec{}, err
	}
	if err := s.a.disks.MountAll(ctx, s.vmi); err != nil {
		return handler.SandboxSpec{}, err
	}
	if err := s.a.claims.MountAll(ctx, s.vmi, pid); err != nil {
		return handler.SandboxSpec{}, err
	}
	// The launcher, the compute container's main process, runs on its container's cpuset: with
	// the static CPU manager, the exclusive CPUs of a Guaranteed pod's whole CPUs.
	cpus, err := procfs.Affinity(pid)
	if err != nil {
		return handler.SandboxSpec{}, fmt.Errorf("launcher at %s: its CPUs: %w", socket, err)
	}
	return handler.SandboxSpec{
		Devices: devices,
		// The launcher pod of a VMI with dedicatedCpuPlacement asks for exactly its dedicated
		// CPUs (controlplane/launcherpod); the domain spec pins only for such a VMI.
		CPUs: cpus, ExactCPUs: true,
		LauncherSocket: socket, NetNSPath: fmt.Sprintf("/proc/%d/ns/net", pid),
		Dir: layout.VMIDir(cfg.HostStateDir, s.vmi.UID),
		// The launcher pod of a VMI on huge pages has an emptyDir of its page size there
		// (controlplane/launcherpod); the domain spec names it only for such a VMI. Set
		// whatever the VMI, since s.vmi may be the stub of a VMI known from its state alone.
		HugepagesDir: layout.HugepagesDir,
		// The handler labels the VMI's files with it where the node has SELinux enabled.
		SELinuxLevel: level,
		Owner:        owner,
	}, nil
}

// selinuxLevel is the SELinux level the VMI's launcher pods run at (mcs.PodLevel): a VMI's pods
// all have one, its status.selinuxLevel, which a migration's target pod keeps. Read from its
// pods on this node (the record, which a migration's target is before the VMI's status names
// it), else from the VMI's status; "" for a VMI made before levels were.
func (a *Agent) selinuxLevel(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (string, error) {
	pods, err := a.nodePods(ctx, vmi)
	if err != nil {
		return "", err
	}
	for i := range pods {
		l, ok, err := mcs.PodLevel(&pods[i])
		if err != nil {
			return "", fmt.Errorf("launcher pod's SELinux level: %w", err)
		}
		if ok {
			return l.String(), nil
		}
	}
	return vmi.Status.SELinuxLevel, nil
}

// Exited implements handler.Sandbox: closed once the agent saw the launcher pod end (end).
func (s *podSandbox) Exited() <-chan struct{} { return s.exited }

// ExitReason implements handler.Sandbox.
func (s *podSandbox) ExitReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why
}

// end ends the sandbox, saying why; it does nothing once it ended.
func (s *podSandbox) end(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.exited:
	default:
		s.why = why
		close(s.exited)
	}
}

// Close implements handler.Sandbox: it unmounts the VMI's containerDisk disks, claims and
// persistent state (the VM is gone and the storage driver released its overlays) and forgets
// the sandbox.
func (s *podSandbox) Close(context.Context) error {
	if err := s.a.releaseMounts(s.vmi.UID); err != nil {
		return err
	}
	s.a.forgetSandbox(s.vmi.UID, s)
	return nil
}

// forgetSandbox drops the VMI's podSandbox if it is sb.
func (a *Agent) forgetSandbox(uid types.UID, sb *podSandbox) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sandboxes[uid] == sb {
		delete(a.sandboxes, uid)
	}
}
