package vmi

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// liveMigratable is the VMI's LiveMigratable condition: True when nothing in the VMI keeps it on
// its node, else False with the reason of the first kind of obstacle, in this order, and a
// message naming every obstacle (the reasons are KubeVirt's where KubeVirt has one):
//
//	| obstacle                                                                  | reason                      |
//	|---------------------------------------------------------------------------|-----------------------------|
//	| a hostDisk volume not marked shared                                        | DisksNotLiveMigratable      |
//	| a persistentVolumeClaim whose claim is not ReadWriteMany, or does not exist | DisksNotLiveMigratable      |
//	| an ephemeral volume whose backing claim is neither ReadWriteMany nor ReadOnlyMany | DisksNotLiveMigratable |
//	| an interface with bridge binding on the pod network                        | InterfaceNotLiveMigratable  |
//	| a GPU or host device passed through                                        | HostDeviceNotLiveMigratable |
//	| a writable node-local disk (containerDisk, emptyDisk) with a driver known  | DisksNotLiveMigratable      |
//	|   not to copy disks in a migration (driverMigratesDisks false)             |                             |
//	| a hypervisor driver known not to declare migration (driverMigrates false)  | DriverNotLiveMigratable     |
//
// Disks that are the VMI's own (containerDisk, emptyDisk, cloud-init) move with it and do not
// count, unless the driver does not copy disks. claims holds the claims of the VMI's volumes that exist, by name; a claim's access
// modes are its status's once bound, else its spec's. driverMigrates says whether the VMI's
// hypervisor driver (named driver) declares migration on the VMI's node, as the node's handler
// publishes it (v1alpha1.DriverMigrationLabel); nil when that is not known (no node yet, a node
// whose handler has not said), and then it is not a reason; driverMigratesDisks likewise says
// whether it copies the writable node-local disks (v1alpha1.DriverMigrationDisksLabel). The
// condition carries no observed generation or times: deriveStatus sets those.
func liveMigratable(vmi *v1alpha1.VirtualMachineInstance, driver string, claims map[string]*corev1.PersistentVolumeClaim, driverMigrates, driverMigratesDisks *bool) v1alpha1.VirtualMachineInstanceCondition {
	type obstacle struct{ reason, what string }
	var obstacles []obstacle
	add := func(reason, format string, args ...any) {
		obstacles = append(obstacles, obstacle{reason, fmt.Sprintf(format, args...)})
	}

	for _, v := range vmi.Spec.Volumes {
		switch {
		case v.HostDisk != nil && (v.HostDisk.Shared == nil || !*v.HostDisk.Shared):
			add(v1alpha1.ReasonDisksNotLiveMigratable, "volume %s: hostDisk %s is not shared between nodes (hostDisk.shared)", v.Name, v.HostDisk.Path)
		case v.PersistentVolumeClaim != nil:
			name := v.PersistentVolumeClaim.ClaimName
			if msg := claimShared(claims[name], corev1.ReadWriteMany); msg != "" {
				add(v1alpha1.ReasonDisksNotLiveMigratable, "volume %s: PersistentVolumeClaim %s %s", v.Name, name, msg)
			}
		case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
			name := v.Ephemeral.PersistentVolumeClaim.ClaimName
			if msg := claimShared(claims[name], corev1.ReadWriteMany, corev1.ReadOnlyMany); msg != "" {
				add(v1alpha1.ReasonDisksNotLiveMigratable, "volume %s: ephemeral's PersistentVolumeClaim %s %s", v.Name, name, msg)
			}
		}
	}
	if driverMigratesDisks != nil && !*driverMigratesDisks {
		for _, d := range vmi.Spec.LocalWritableDisks() {
			what := "an emptyDisk"
			if d.Overlay {
				what = "a containerDisk, whose writable overlay"
			}
			add(v1alpha1.ReasonDisksNotLiveMigratable, "volume %s: %s is on its node alone, and hypervisor driver %s does not copy disks in a migration on node %s", d.Name, what, driver, vmi.Status.NodeName)
		}
	}

	podNetworks := map[string]bool{}
	for _, n := range vmi.Spec.Networks {
		if n.Pod != nil {
			podNetworks[n.Name] = true
		}
	}
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Bridge != nil && podNetworks[iface.Name] {
			add(v1alpha1.ReasonInterfaceNotLiveMigratable,
				"interface %s: bridge binding on the pod network gives the guest the pod's address, which the target pod does not have (use masquerade)", iface.Name)
		}
	}

	for _, g := range vmi.Spec.Domain.Devices.GPUs {
		add(v1alpha1.ReasonHostDeviceNotLiveMigratable, "GPU %s (%s) is passed through from the host", g.Name, g.DeviceName)
	}
	for _, d := range vmi.Spec.Domain.Devices.HostDevices {
		add(v1alpha1.ReasonHostDeviceNotLiveMigratable, "host device %s (%s) is passed through from the host", d.Name, d.DeviceName)
	}

	if driverMigrates != nil && !*driverMigrates {
		add(v1alpha1.ReasonDriverNotLiveMigratable, "hypervisor driver %s does not declare live migration on node %s", driver, vmi.Status.NodeName)
	}

	if len(obstacles) == 0 {
		return v1alpha1.VirtualMachineInstanceCondition{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}
	}
	msgs := make([]string, len(obstacles))
	for i, o := range obstacles {
		msgs[i] = o.what
	}
	// Obstacles are found kind by kind in the table's order: the first is of the first kind.
	reason := obstacles[0].reason
	return v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionFalse,
		Reason: reason, Message: strings.Join(msgs, "; "),
	}
}

// claimShared says why pvc cannot be used from two nodes at once, "" when it has one of modes.
func claimShared(pvc *corev1.PersistentVolumeClaim, modes ...corev1.PersistentVolumeAccessMode) string {
	if pvc == nil {
		return "does not exist"
	}
	have := pvc.Status.AccessModes
	if len(have) == 0 {
		have = pvc.Spec.AccessModes
	}
	for _, m := range modes {
		if slices.Contains(have, m) {
			return ""
		}
	}
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = string(m)
	}
	return fmt.Sprintf("has access modes %v, not %s (the target node mounts it while the source still does)", have, strings.Join(names, " or "))
}
