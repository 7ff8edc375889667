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
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIsDefaultClass(t *testing.T) {
	withAnnotations := func(a map[string]string) *HypervisorClass {
		return &HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: "qemu", Annotations: a}, Driver: "qmp"}
	}
	tests := []struct {
		name  string
		class *HypervisorClass
		want  bool
	}{
		{"nil class", nil, false},
		{"no annotations", withAnnotations(nil), false},
		{"other annotations only", withAnnotations(map[string]string{"a": "true"}), false},
		{"annotated true", withAnnotations(map[string]string{IsDefaultHypervisorClassAnnotation: "true"}), true},
		{"annotated false", withAnnotations(map[string]string{IsDefaultHypervisorClassAnnotation: "false"}), false},
		{"annotated empty", withAnnotations(map[string]string{IsDefaultHypervisorClassAnnotation: ""}), false},
		{"value is case-sensitive", withAnnotations(map[string]string{IsDefaultHypervisorClassAnnotation: "True"}), false},
		{"storage class annotation does not count", withAnnotations(map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsDefaultClass(tt.class); got != tt.want {
				t.Errorf("IsDefaultClass() = %t, want %t", got, tt.want)
			}
		})
	}
	if IsDefaultHypervisorClassAnnotation != "hypervisorclass.kubevisor.io/is-default-class" {
		t.Errorf("annotation = %q", IsDefaultHypervisorClassAnnotation)
	}
}
