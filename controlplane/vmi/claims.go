package vmi

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// claimRef is a PersistentVolumeClaim a VMI's volume names.
type claimRef struct {
	// Claim is the claim's name, in the VMI's namespace.
	Claim string
	// Volume is the first VMI volume that names it.
	Volume string
}

// volumeClaim is the PersistentVolumeClaim a volume names (persistentVolumeClaim, or ephemeral's
// backing claim); "" for any other volume.
func volumeClaim(v v1alpha1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
		return v.Ephemeral.PersistentVolumeClaim.ClaimName
	}
	return ""
}

// claimRefs lists the PersistentVolumeClaims the VMI's volumes name (persistentVolumeClaim and
// ephemeral's backing claim), each once, in the order of spec.volumes.
func claimRefs(vmi *v1alpha1.VirtualMachineInstance) []claimRef {
	var refs []claimRef
	seen := map[string]bool{}
	for _, v := range vmi.Spec.Volumes {
		name := volumeClaim(v)
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		refs = append(refs, claimRef{Claim: name, Volume: v.Name})
	}
	return refs
}

// checksClaims says whether the VMI's claims are looked at in this phase: until its launcher pod
// runs (Scheduled), since what they lack is what keeps the pod from being created or scheduled.
func checksClaims(vmi *v1alpha1.VirtualMachineInstance) bool {
	switch vmi.Status.Phase {
	case v1alpha1.VMIPhaseUnset, v1alpha1.Pending, v1alpha1.Scheduling:
		return vmi.DeletionTimestamp == nil
	}
	return false
}

// claimsProblem says what the claims refs name lack, in KubeVirt's order: claims that do not
// exist (FailedPvcNotFound) before claims that exist and are not bound to a volume, Pending or
// Lost (WaitingForVolumeBinding); nil when every claim is bound. found holds the claims that
// exist, by name. The message names each claim, with its namespace and the volume using it.
func claimsProblem(namespace string, refs []claimRef, found map[string]*corev1.PersistentVolumeClaim) *problem {
	var missing, unbound []string
	for _, ref := range refs {
		pvc, ok := found[ref.Claim]
		switch {
		case !ok || pvc == nil:
			missing = append(missing, fmt.Sprintf("PersistentVolumeClaim %s/%s (volume %s) does not exist", namespace, ref.Claim, ref.Volume))
		case pvc.Status.Phase != corev1.ClaimBound:
			phase := pvc.Status.Phase
			if phase == "" {
				phase = corev1.ClaimPending
			}
			unbound = append(unbound, fmt.Sprintf("PersistentVolumeClaim %s/%s (volume %s) is not bound to a volume yet (phase %s)",
				namespace, ref.Claim, ref.Volume, phase))
		}
	}
	switch {
	case len(missing) > 0:
		return &problem{Reason: v1alpha1.ReasonFailedPvcNotFound, Message: strings.Join(missing, "; ")}
	case len(unbound) > 0:
		return &problem{Reason: v1alpha1.ReasonWaitingForVolumeBinding, Message: strings.Join(unbound, "; ")}
	}
	return nil
}

// volumeStatus is the status of the VMI's claim volumes (persistentVolumeClaim and ephemeral)
// whose claims are bound, in the order of spec.volumes: each claim's modes and size, as KubeVirt's
// virt-controller writes them. The node sizes the disk image it makes on an empty file-system
// claim from it. found holds the claims that exist, by name.
func volumeStatus(vmi *v1alpha1.VirtualMachineInstance, found map[string]*corev1.PersistentVolumeClaim) []v1alpha1.VolumeStatus {
	var out []v1alpha1.VolumeStatus
	for _, v := range vmi.Spec.Volumes {
		name := volumeClaim(v)
		pvc := found[name]
		if name == "" || pvc == nil || pvc.Status.Phase != corev1.ClaimBound {
			continue
		}
		out = append(out, v1alpha1.VolumeStatus{Name: v.Name, PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{
			ClaimName:          name,
			AccessModes:        pvc.Status.AccessModes,
			VolumeMode:         pvc.Spec.VolumeMode,
			Capacity:           pvc.Status.Capacity,
			Requests:           pvc.Spec.Resources.Requests,
			FilesystemOverhead: v1alpha1.DefaultFilesystemOverhead,
		}})
	}
	return out
}

// holdsPod says the problem keeps the launcher pod from being created: a claim that does not
// exist (as KubeVirt, which waits for it to appear). An unbound claim does not: binding may wait
// for the pod (WaitForFirstConsumer).
func (p *problem) holdsPod() bool {
	return p != nil && p.Reason == v1alpha1.ReasonFailedPvcNotFound
}
