package cluster

import (
	"context"
	"fmt"
	"path"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/core/layout"
)

// podResolver is the agent's handler.Resolver: what a VMI names outside itself, as its launcher
// pod has it. Images are the handler's default (handler.MapResolver); Secrets are read from the
// launcher pod, whose compute container has each Secret the VMI names as a read-only volume at
// layout.SecretDir (controlplane/launcherpod, secrets.go); a claim is the directory where the
// handler mounts it from the launcher pod (podClaims: podSandbox.Open mounts the claims before
// the storage driver runs), and so is the VM's persistent state (PersistentState mounts it). It
// finds the launcher process through its socket (as podSandbox.Open does) and reads the files
// in that process's root, resolving every path inside it (openat2 RESOLVE_IN_ROOT), so that a
// symlink in the container cannot name a file of the node. The handler thus reads only Secrets
// and claims the kubelet gave to a pod of the VMI, with no right on Secrets of its own.
type podResolver struct {
	handler.MapResolver
	a *Agent
}

var _ handler.Resolver = podResolver{}

// Claim implements handler.Resolver: the node path where the claim of the VMI's volume that
// uses it is mounted (podClaims.Path), a directory (the storage driver takes disk.img in it).
// The handler config's claims do not apply in a cluster.
func (r podResolver) Claim(_ context.Context, vmi *v1alpha1.VirtualMachineInstance, claim string) (string, error) {
	for _, v := range claimVolumes(vmi) {
		if v.claim == claim {
			return r.a.claims.Path(vmi.UID, v.volume), nil
		}
	}
	return "", fmt.Errorf("persistentVolumeClaim %q: no persistentVolumeClaim or ephemeral volume of the VMI uses it", claim)
}

// PersistentState returns the node path of the VMI's persistent state directory (the TPM
// state and EFI variable store that outlive the VMI), for a VMI that asks for one. The control
// plane mounts the VM's state claim in the launcher pod's compute container at
// layout.VMStateDir; PersistentState mounts it from there, read-write, at layout.StateMount
// (podClaims.MountState), and does nothing more when it is mounted there already.
func (r podResolver) PersistentState(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (string, error) {
	pid, err := r.launcherPid(ctx, vmi)
	if err != nil {
		return "", fmt.Errorf("persistent state: the launcher, whose pod has its claim: %w", err)
	}
	p, err := r.a.claims.MountState(pid, vmi.UID)
	if err != nil {
		return "", fmt.Errorf("persistent state (the VM's state claim, at %s in the launcher pod): %w", layout.VMStateDir, err)
	}
	return p, nil
}

// launcherPid dials the VMI's launcher and returns its pid, as the handler sees it: in the
// per-VMI directory, bound first (vmidir.go), since the resolver may run before the sandbox opens.
func (r podResolver) launcherPid(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (int, error) {
	if _, err := r.a.bindVMIDir(ctx, vmi); err != nil {
		return 0, err
	}
	socket := path.Join(layout.LauncherDir(r.a.cfg.HostStateDir, vmi.UID), launcher.SocketName)
	dctx, cancel := context.WithTimeout(ctx, r.a.cfg.DialTimeout)
	defer cancel()
	c, err := launcher.Dial(dctx, socket)
	if err != nil {
		return 0, err
	}
	pid := c.LauncherPid()
	_ = c.Close()
	if pid <= 0 {
		return 0, fmt.Errorf("the launcher's pid is not visible from the handler (the handler needs the host's pid namespace)")
	}
	return pid, nil
}
