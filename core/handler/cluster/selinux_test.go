package cluster

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestSELinuxLevel: the sandbox's SELinux level is the one the VMI's launcher pod on this node
// runs at (a migration's target too, before the VMI's status names it), else the VMI's
// status.selinuxLevel; a level that is not one is an error.
func TestSELinuxLevel(t *testing.T) {
	pod := func(name, node, level string, migration bool) client.Object {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{v1alpha1.CreatedByLabel: "vmi-uid"}},
			Spec:       corev1.PodSpec{NodeName: node},
		}
		if migration {
			p.Labels[v1alpha1.MigrationUIDLabel] = "mig"
		}
		if level != "" {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: level}}
		}
		return p
	}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "vmi-uid"}}
	vmi.Status.SELinuxLevel = "s0:c7,c8"
	for _, tc := range []struct {
		name    string
		pods    []client.Object
		want    string
		wantErr string
	}{
		{"the pod on this node", []client.Object{pod("launcher", "node-1", "s0:c1,c2", false)}, "s0:c1,c2", ""},
		{"a migration's target on this node", []client.Object{pod("source", "node-0", "s0:c3,c4", false), pod("target", "node-1", "s0:c3,c4", true)}, "s0:c3,c4", ""},
		{"no pod here: the status's", []client.Object{pod("source", "node-0", "s0:c3,c4", false)}, "s0:c7,c8", ""},
		{"a pod from before levels: the status's", []client.Object{pod("launcher", "node-1", "", false)}, "s0:c7,c8", ""},
		{"not a level", []client.Object{pod("launcher", "node-1", "s0:c9", false)}, "", `"s0:c9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: AgentConfig{NodeName: "node-1"}, client: fake.NewClientBuilder().WithObjects(tc.pods...).Build()}
			got, err := a.selinuxLevel(context.Background(), vmi)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("level %q, error %v; want an error with %s", got, err, tc.wantErr)
			case tc.wantErr == "" && (err != nil || got != tc.want):
				t.Errorf("level %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
