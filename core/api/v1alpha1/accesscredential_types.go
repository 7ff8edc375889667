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
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// AccessCredential is a credential that lets someone into the guest. Only sshPublicKey exists:
// KubeVirt's userPassword needs the guest agent to set the password, which Kubevisor does not
// do.
type AccessCredential struct {
	// SSHPublicKey is a set of SSH public keys and how they reach the guest.
	// +optional
	SSHPublicKey *SSHPublicKeyAccessCredential `json:"sshPublicKey,omitempty"`
}

// SSHPublicKeyAccessCredential is where SSH public keys come from and how they reach the guest.
type SSHPublicKeyAccessCredential struct {
	// Source is where the public keys are read from.
	Source SSHPublicKeyAccessCredentialSource `json:"source"`
	// PropagationMethod is how the public keys reach the guest.
	PropagationMethod SSHPublicKeyAccessCredentialPropagationMethod `json:"propagationMethod"`
}

// SSHPublicKeyAccessCredentialSource is where SSH public keys are read from. Exactly one of its
// members must be set.
type SSHPublicKeyAccessCredentialSource struct {
	// Secret in the VMI's namespace: every value of it is one or more public keys, one a line.
	// +optional
	Secret *AccessCredentialSecretSource `json:"secret,omitempty"`
}

// AccessCredentialSecretSource names the Secret of an access credential.
type AccessCredentialSecretSource struct {
	// SecretName is the name of the Secret, in the VMI's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
}

// SSHPublicKeyAccessCredentialPropagationMethod is how SSH public keys reach the guest. Exactly
// one of its members must be set: the keys go into the ssh_authorized_keys of the user data of
// the VMI's cloudInitNoCloud or cloudInitConfigDrive volume, which must exist.
type SSHPublicKeyAccessCredentialPropagationMethod struct {
	// ConfigDrive adds the keys to the user data of the cloudInitConfigDrive volume.
	// +optional
	ConfigDrive *ConfigDriveSSHPublicKeyAccessCredentialPropagation `json:"configDrive,omitempty"`
	// NoCloud adds the keys to the user data of the cloudInitNoCloud volume.
	// +optional
	NoCloud *NoCloudSSHPublicKeyAccessCredentialPropagation `json:"noCloud,omitempty"`
}

// ConfigDriveSSHPublicKeyAccessCredentialPropagation selects the cloudInitConfigDrive volume.
type ConfigDriveSSHPublicKeyAccessCredentialPropagation struct{}

// NoCloudSSHPublicKeyAccessCredentialPropagation selects the cloudInitNoCloud volume.
type NoCloudSSHPublicKeyAccessCredentialPropagation struct{}

// SecretNames are the Secrets of the VMI's namespace that the spec names, sorted and without
// duplicates: cloud-init user and network data (secretRef, networkDataSecretRef) and access
// credentials. The launcher pod mounts each; the node handler reads them there.
func (s *VirtualMachineInstanceSpec) SecretNames() []string {
	var names []string
	ref := func(r *corev1.LocalObjectReference) {
		if r != nil && r.Name != "" {
			names = append(names, r.Name)
		}
	}
	for _, v := range s.Volumes {
		if ci := v.CloudInitNoCloud; ci != nil {
			ref(ci.UserDataSecretRef)
			ref(ci.NetworkDataSecretRef)
		}
		if ci := v.CloudInitConfigDrive; ci != nil {
			ref(ci.UserDataSecretRef)
			ref(ci.NetworkDataSecretRef)
		}
	}
	for _, ac := range s.AccessCredentials {
		if ssh := ac.SSHPublicKey; ssh != nil && ssh.Source.Secret != nil && ssh.Source.Secret.SecretName != "" {
			names = append(names, ssh.Source.Secret.SecretName)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
