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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the subresources.
const GroupName = "subresources.kubevisor.io"

// GroupVersion is the group and version of this package's types.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Subresource names, as they appear in paths
// (/apis/subresources.kubevisor.io/v1alpha1/namespaces/NS/virtualmachineinstances/NAME/console).
const (
	// VirtualMachineInstances and VirtualMachines are the parent resources.
	VirtualMachineInstances = "virtualmachineinstances"
	VirtualMachines         = "virtualmachines"

	// Streams of a VMI: GET with a WebSocket upgrade (subprotocol StreamProtocol).
	SubresourceConsole     = "console"
	SubresourceVNC         = "vnc"
	SubresourcePortForward = "portforward"

	// Actions on a VMI: PUT.
	SubresourcePause      = "pause"
	SubresourceUnpause    = "unpause"
	SubresourceSoftReboot = "softreboot"
	SubresourceReset      = "reset"
	// SubresourceGuestOSInfo is a GET on a VMI answering a GuestOSInfo.
	SubresourceGuestOSInfo = "guestosinfo"

	// Actions on a VM: PUT, with the body named beside each.
	SubresourceStart           = "start"           // StartOptions
	SubresourceStop            = "stop"            // StopOptions
	SubresourceRestart         = "restart"         // RestartOptions
	SubresourceMigrate         = "migrate"         // MigrateOptions
	SubresourceCancelMigration = "cancelmigration" // no body
)

// StreamProtocol is the WebSocket subprotocol of every stream: binary messages carry the raw
// bytes (serial console, RFB, or one TCP connection), in both directions; the server pings
// at an interval (core/wsstream.PingInterval) and closes a stream whose peer stopped answering.
const StreamProtocol = "plain.kubevisor.io"

// StartOptions is the body of a VM's start.
//
// +kubebuilder:object:root=true
type StartOptions struct {
	metav1.TypeMeta `json:",inline"`
}

// StopOptions is the body of a VM's stop.
//
// +kubebuilder:object:root=true
type StopOptions struct {
	metav1.TypeMeta `json:",inline"`
	// GracePeriodSeconds, when set, replaces the VMI's termination grace period for this stop:
	// the guest gets that long to power off after the ACPI request before it is killed.
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// Force stops the VM at once, without asking the guest (a grace period of 0).
	// +optional
	Force bool `json:"force,omitempty"`
}

// RestartOptions is the body of a VM's restart.
//
// +kubebuilder:object:root=true
type RestartOptions struct {
	metav1.TypeMeta `json:",inline"`
	// GracePeriodSeconds, when set, replaces the VMI's termination grace period for stopping the
	// running instance.
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
}

// MigrateOptions is the body of a VM's migrate.
//
// +kubebuilder:object:root=true
type MigrateOptions struct {
	metav1.TypeMeta `json:",inline"`
	// DryRun, as in any Kubernetes write ("All"), validates the migration without creating it.
	// +optional
	DryRun []string `json:"dryRun,omitempty"`
}

// PortForwardOptions are the path parameters of a VMI's portforward:
// portforward/{port} or portforward/{port}/{protocol}.
//
// +kubebuilder:object:root=true
type PortForwardOptions struct {
	metav1.TypeMeta `json:",inline"`
	// Port is the guest's port, 1 to 65535.
	Port int32 `json:"port"`
	// Protocol is "tcp" (the default); the stream is one TCP connection to the guest.
	// +optional
	Protocol string `json:"protocol,omitempty"`
}

// GuestOSInfo is what is known of the guest's operating system.
//
// +kubebuilder:object:root=true
type GuestOSInfo struct {
	metav1.TypeMeta `json:",inline"`
	// Name, Version and KernelRelease as the guest reports them ("debian", "12", "6.1.0-31").
	Name          string `json:"name,omitempty"`
	Version       string `json:"version,omitempty"`
	KernelRelease string `json:"kernelRelease,omitempty"`
	// Machine is the guest's architecture ("x86_64").
	Machine string `json:"machine,omitempty"`
}

// ServerVersion is kubevisor-api's build, answered at /apis/subresources.kubevisor.io/v1alpha1/version.
//
// +kubebuilder:object:root=true
type ServerVersion struct {
	metav1.TypeMeta `json:",inline"`
	GitVersion      string `json:"gitVersion"`
	GoVersion       string `json:"goVersion"`
	Platform        string `json:"platform"`
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&StartOptions{}, &StopOptions{}, &RestartOptions{}, &MigrateOptions{},
		&PortForwardOptions{}, &GuestOSInfo{}, &ServerVersion{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
