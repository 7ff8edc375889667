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

// Package v1alpha1 is the subresource API, subresources.kubevisor.io/v1alpha1: the options and
// answers of the actions on VirtualMachines and VirtualMachineInstances that kubevisor-api
// serves as an aggregated API (console, vnc, portforward, pause, start, stop, migrate...). The
// objects themselves live in kubevisor.io/v1alpha1; nothing here is stored.
//
// +kubebuilder:object:generate=true
// +kubebuilder:skip
// +groupName=subresources.kubevisor.io
package v1alpha1
