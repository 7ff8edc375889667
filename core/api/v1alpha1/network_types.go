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

// Network is a named network of a VMI; interfaces refer to it by name.
type Network struct {
	// Name of the network. Must be a DNS_LABEL and unique within the VMI.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// NetworkSource is the network the interface is connected to. Defaults to the pod network.
	NetworkSource `json:",inline"`
}

// NetworkSource is the network an interface is connected to. At most one of its members may be set.
// +kubebuilder:validation:XValidation:rule="!(has(self.pod) && has(self.multus))",message="pod and multus are mutually exclusive"
type NetworkSource struct {
	// Pod is the launcher pod's own network.
	// +optional
	Pod *PodNetwork `json:"pod,omitempty"`
	// Multus is a secondary network given by a NetworkAttachmentDefinition.
	// +optional
	Multus *MultusNetwork `json:"multus,omitempty"`
}

// PodNetwork is the launcher pod's own network.
type PodNetwork struct {
	// VMNetworkCIDR is the IPv4 CIDR of the guest network behind masquerade. Defaults to 10.0.2.0/24.
	// +optional
	VMNetworkCIDR string `json:"vmNetworkCIDR,omitempty"`
	// VMIPv6NetworkCIDR is the IPv6 CIDR of the guest network behind masquerade. Defaults to fd10:0:2::/120.
	// +optional
	VMIPv6NetworkCIDR string `json:"vmIPv6NetworkCIDR,omitempty"`
}

// MultusNetwork is a secondary network given by a NetworkAttachmentDefinition.
type MultusNetwork struct {
	// NetworkName references a NetworkAttachmentDefinition as <name> or <namespace>/<name>;
	// without a namespace the VMI's namespace is assumed.
	// +kubebuilder:validation:MinLength=1
	NetworkName string `json:"networkName"`
	// Default makes this network the pod's default network instead of the cluster network.
	// +optional
	Default bool `json:"default,omitempty"`
}
