/*
Copyright 2026 The Kubevisor Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Volume is a named volume of a VMI; disks refer to it by name.
type Volume struct {
	// Name of the volume. Must be a DNS_LABEL and unique within the VMI.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// VolumeSource is where the volume's data comes from. Exactly one source must be set.
	VolumeSource `json:",inline"`
}

// VolumeSource is where a volume's data comes from. Exactly one of its members must be set.
// +kubebuilder:validation:XValidation:rule="(has(self.hostDisk)?1:0)+(has(self.persistentVolumeClaim)?1:0)+(has(self.cloudInitNoCloud)?1:0)+(has(self.cloudInitConfigDrive)?1:0)+(has(self.containerDisk)?1:0)+(has(self.ephemeral)?1:0)+(has(self.emptyDisk)?1:0) == 1",message="exactly one volume source must be set; supported sources: containerDisk, cloudInitNoCloud, cloudInitConfigDrive, emptyDisk, hostDisk, persistentVolumeClaim, ephemeral"
type VolumeSource struct {
	// HostDisk is a disk image file on the node.
	// +optional
	HostDisk *HostDisk `json:"hostDisk,omitempty"`
	// PersistentVolumeClaim attaches a PVC in the VMI's namespace.
	// +optional
	PersistentVolumeClaim *PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
	// CloudInitNoCloud is cloud-init NoCloud data, attached as a disk.
	// +optional
	CloudInitNoCloud *CloudInitNoCloudSource `json:"cloudInitNoCloud,omitempty"`
	// CloudInitConfigDrive is cloud-init config drive data, attached as a disk.
	// +optional
	CloudInitConfigDrive *CloudInitConfigDriveSource `json:"cloudInitConfigDrive,omitempty"`
	// ContainerDisk is a container image that embeds a qcow2 or raw disk image.
	// +optional
	ContainerDisk *ContainerDiskSource `json:"containerDisk,omitempty"`
	// Ephemeral is a copy-on-write layer over a PVC, discarded with the VMI.
	// +optional
	Ephemeral *EphemeralVolumeSource `json:"ephemeral,omitempty"`
	// EmptyDisk is a temporary sparse disk that shares the VMI's lifecycle.
	// +optional
	EmptyDisk *EmptyDiskSource `json:"emptyDisk,omitempty"`
}

// HostDiskType says whether a host disk image must exist or may be created.
// +kubebuilder:validation:Enum=Disk;DiskOrCreate
type HostDiskType string

// Host disk types.
const (
	// HostDiskExists requires the disk image to exist.
	HostDiskExists HostDiskType = "Disk"
	// HostDiskExistsOrCreate creates the disk image with the given capacity if it does not exist.
	HostDiskExistsOrCreate HostDiskType = "DiskOrCreate"
)

// HostDisk is a disk image file on the node.
// +kubebuilder:validation:XValidation:rule="self.type != 'DiskOrCreate' || has(self.capacity)",message="capacity is required when type is DiskOrCreate"
type HostDisk struct {
	// Path of the disk image on the node.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Type is Disk (the image must exist) or DiskOrCreate (create it if missing).
	Type HostDiskType `json:"type"`
	// Capacity of the sparse disk image created for DiskOrCreate.
	// +optional
	Capacity resource.Quantity `json:"capacity,omitempty,omitzero"`
	// Shared says the path is shared between nodes.
	// +optional
	Shared *bool `json:"shared,omitempty"`
}

// PersistentVolumeClaimVolumeSource attaches a PersistentVolumeClaim in the VMI's namespace.
type PersistentVolumeClaimVolumeSource struct {
	corev1.PersistentVolumeClaimVolumeSource `json:",inline"`
	// Hotpluggable says the volume can be hot-plugged and hot-unplugged.
	// +optional
	Hotpluggable bool `json:"hotpluggable,omitempty"`
}

// EphemeralVolumeSource is a copy-on-write layer over a PersistentVolumeClaim.
type EphemeralVolumeSource struct {
	// PersistentVolumeClaim is the read-only backing claim.
	// +optional
	PersistentVolumeClaim *corev1.PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
}

// EmptyDiskSource is a temporary sparse disk.
type EmptyDiskSource struct {
	// Capacity of the sparse disk.
	Capacity resource.Quantity `json:"capacity"`
}

// ContainerDiskSource is a container image that embeds a disk image.
type ContainerDiskSource struct {
	// Image is the name of the image with the embedded disk.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// Path is the path of the disk image inside the container. Defaults to the single file under /disk.
	// +optional
	Path string `json:"path,omitempty"`
	// ImagePullPolicy is one of Always, Never, IfNotPresent.
	// +kubebuilder:validation:Enum=Always;Never;IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
}

// CloudInitNoCloudSource is cloud-init NoCloud user and network data.
// See https://cloudinit.readthedocs.io/en/latest/topics/datasources/nocloud.html.
type CloudInitNoCloudSource struct {
	// UserDataSecretRef references a secret that holds the user data (key "userdata" or "userData").
	// +optional
	UserDataSecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`
	// UserDataBase64 is the user data, base64 encoded.
	// +optional
	UserDataBase64 string `json:"userDataBase64,omitempty"`
	// UserData is the user data, inline.
	// +optional
	UserData string `json:"userData,omitempty"`
	// NetworkDataSecretRef references a secret that holds the network data (key "networkdata" or "networkData").
	// +optional
	NetworkDataSecretRef *corev1.LocalObjectReference `json:"networkDataSecretRef,omitempty"`
	// NetworkDataBase64 is the network data, base64 encoded.
	// +optional
	NetworkDataBase64 string `json:"networkDataBase64,omitempty"`
	// NetworkData is the network data, inline.
	// +optional
	NetworkData string `json:"networkData,omitempty"`
}

// CloudInitConfigDriveSource is cloud-init config drive user and network data.
// See https://cloudinit.readthedocs.io/en/latest/topics/datasources/configdrive.html.
type CloudInitConfigDriveSource struct {
	// UserDataSecretRef references a secret that holds the user data (key "userdata" or "userData").
	// +optional
	UserDataSecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`
	// UserDataBase64 is the user data, base64 encoded.
	// +optional
	UserDataBase64 string `json:"userDataBase64,omitempty"`
	// UserData is the user data, inline.
	// +optional
	UserData string `json:"userData,omitempty"`
	// NetworkDataSecretRef references a secret that holds the network data (key "networkdata" or "networkData").
	// +optional
	NetworkDataSecretRef *corev1.LocalObjectReference `json:"networkDataSecretRef,omitempty"`
	// NetworkDataBase64 is the network data, base64 encoded.
	// +optional
	NetworkDataBase64 string `json:"networkDataBase64,omitempty"`
	// NetworkData is the network data, inline.
	// +optional
	NetworkData string `json:"networkData,omitempty"`
}
