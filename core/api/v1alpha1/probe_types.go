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
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// Probe is a periodic health check of a VMI's guest, as kubevirt.io/v1's. The kubelet runs it on
// the launcher pod's compute container, so its timings have the kubelet's meaning: httpGet and
// tcpSocket against the pod's address, which the guest's pod-network interface answers on; exec
// and guestAgentPing as a command of the launcher image that asks the node handler, which asks
// the guest agent through the hypervisor driver. docs/admission.md ("Probes") says what is
// accepted.
type Probe struct {
	// ProbeHandler is the check the probe runs.
	ProbeHandler `json:",inline"`
	// InitialDelaySeconds is how long after the launcher starts the first probe runs.
	// +kubebuilder:validation:Minimum=0
	// +optional
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`
	// TimeoutSeconds is how long one probe may take. Defaults to 1.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// PeriodSeconds is how often the probe runs. Defaults to 10.
	// +kubebuilder:validation:Minimum=0
	// +optional
	PeriodSeconds int32 `json:"periodSeconds,omitempty"`
	// SuccessThreshold is how many consecutive successes count as success after a failure.
	// Defaults to 1; must be 1 for a liveness probe.
	// +kubebuilder:validation:Minimum=0
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`
	// FailureThreshold is how many consecutive failures count as failure. Defaults to 3.
	// +kubebuilder:validation:Minimum=0
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
}

// ProbeHandler is what a probe checks. Exactly one member must be set.
type ProbeHandler struct {
	// HTTPGet sends an HTTP GET to the guest; a status from 200 to 399 is a success.
	// +optional
	HTTPGet *corev1.HTTPGetAction `json:"httpGet,omitempty"`
	// TCPSocket opens a TCP connection to the guest; a connection is a success.
	// +optional
	TCPSocket *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`
	// Exec runs command in the guest through its guest agent; exit status 0 is a success. The
	// command is not run in a shell: give one ("sh", "-c", ...) for shell syntax. A command still
	// running at timeoutSeconds fails the probe and goes on running in the guest.
	// +optional
	Exec *corev1.ExecAction `json:"exec,omitempty"`
	// GuestAgentPing pings the guest agent; an answer is a success.
	// +optional
	GuestAgentPing *GuestAgentPing `json:"guestAgentPing,omitempty"`
}

// GuestAgentPing is a probe that pings the guest agent. It has no settings.
type GuestAgentPing struct{}

// UsesGuestAgent says whether the probe acts through the guest agent (exec, guestAgentPing).
func (p *Probe) UsesGuestAgent() bool {
	return p != nil && (p.Exec != nil || p.GuestAgentPing != nil)
}

// String names the probe's check for messages: "httpGet port 80 path /", "tcpSocket port 22",
// `exec ["cat" "/tmp/healthy"]`, "guestAgentPing".
func (p *Probe) String() string {
	switch {
	case p == nil:
		return "no probe"
	case p.HTTPGet != nil:
		s := "httpGet port " + p.HTTPGet.Port.String()
		if p.HTTPGet.Path != "" {
			s += " path " + p.HTTPGet.Path
		}
		return s
	case p.TCPSocket != nil:
		return "tcpSocket port " + p.TCPSocket.Port.String()
	case p.Exec != nil:
		return fmt.Sprintf("exec %q", p.Exec.Command)
	case p.GuestAgentPing != nil:
		return "guestAgentPing"
	}
	return "a probe with no check"
}
