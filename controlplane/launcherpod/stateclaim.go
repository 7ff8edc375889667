package launcherpod

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// A VM's persistent state claim (KubeVirt's backend storage) holds what its VMIs keep beyond
// their own life: the TPM's state of a persistent TPM (domain.devices.tpm.persistent) and the
// EFI variable store of persistent EFI (domain.firmware.bootloader.efi.persistent). There is one
// per VM, named StateClaimName and owned by the VM, so that each VMI the VM starts finds the
// state the last one left and the claim goes with the VM; a VMI that no VM owns has one of its
// own, owned by the VMI (its state outlives guest reboots only, as KubeVirt's). The VMI
// controller creates it (StateClaim) before the launcher pod, which mounts it in the compute
// container at layout.VMStateDir (StateVolumeName); the node handler mounts it from there for
// the hypervisor driver. Its storage class is Config.StateStorageClass, else the cluster's
// default class; the claim is ReadWriteOnce, so a VM with persistent state does not live-migrate
// until the class offers ReadWriteMany.
const (
	// StateClaimPrefix starts the name of a persistent state claim (KubeVirt's).
	StateClaimPrefix = "persistent-state-for-"
	// StateVolumeName is the launcher pod's volume of the persistent state claim.
	StateVolumeName = "kubevisor-vm-state"
	// StateClaimLabel names, on a persistent state claim, the VM (or VMI) it is for.
	StateClaimLabel = v1alpha1.GroupName + "/persistent-state-for"
)

// DefaultStateClaimSize is the size of a persistent state claim: a TPM 2.0 state is tens of
// KiB, an EFI variable store 540 KiB (OVMF's 4M build), and KubeVirt asks for 10Mi too.
var DefaultStateClaimSize = resource.MustParse("10Mi")

// stateOwner is the object a VMI's persistent state belongs to: the VM that controls it, else
// the VMI itself.
func stateOwner(vmi *v1alpha1.VirtualMachineInstance) metav1.OwnerReference {
	if ref := metav1.GetControllerOf(vmi); ref != nil && ref.Kind == "VirtualMachine" && ref.APIVersion == v1alpha1.GroupVersion.String() {
		return metav1.OwnerReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}
	}
	return metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID}
}

// StateClaimName is the name of the persistent state claim of the VMI: "persistent-state-for-"
// and the name of its VM (or its own name when no VM owns it).
func StateClaimName(vmi *v1alpha1.VirtualMachineInstance) string {
	return StateClaimPrefix + stateOwner(vmi).Name
}

// StateClaim is the persistent state claim a VMI that NeedsPersistentState uses, to create
// when it does not exist yet; nil for any other VMI.
func StateClaim(vmi *v1alpha1.VirtualMachineInstance, cfg Config) *corev1.PersistentVolumeClaim {
	if !vmi.Spec.NeedsPersistentState() {
		return nil
	}
	owner := stateOwner(vmi)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:            StateClaimName(vmi),
			Namespace:       vmi.Namespace,
			Labels:          map[string]string{StateClaimLabel: owner.Name},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: DefaultStateClaimSize.DeepCopy(),
			}},
		},
	}
	if cfg.StateStorageClass != "" {
		pvc.Spec.StorageClassName = ptr.To(cfg.StateStorageClass)
	}
	return pvc
}
