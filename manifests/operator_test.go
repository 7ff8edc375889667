package manifests_test

import (
	"bytes"
	"os/exec"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestOperatorManifests renders manifests/operator as `kubectl apply -k` does: the Kubevisor
// CRD, the operator's generated roles bound to its service account and nothing else, no
// wildcard in any rule, and an unprivileged Deployment that finds its own version through the
// downward API.
func TestOperatorManifests(t *testing.T) {
	kubectl := testenv.Command(t, "kubectl", "kubectl (its built-in kustomize renders the operator's manifests)")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", "operator")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize manifests/operator: %v\n%s", err, stderr.String())
	}
	r := rendered{objs: decodeAll(t, stdout.Bytes())}
	var kinds []string
	for _, o := range r.objs {
		kinds = append(kinds, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(kinds)
	want := []string{
		"ClusterRole /kubevisor-operator", "ClusterRoleBinding /kubevisor-operator",
		"CustomResourceDefinition /kubevisors.kubevisor.io", "Deployment kubevisor-system/kubevisor-operator",
		"Namespace /kubevisor-system", "Role kube-system/kubevisor-operator", "Role kubevisor-system/kubevisor-operator",
		"RoleBinding kube-system/kubevisor-operator", "RoleBinding kubevisor-system/kubevisor-operator",
		"ServiceAccount kubevisor-system/kubevisor-operator",
	}
	if !slices.Equal(kinds, want) {
		t.Fatalf("objects %v, want %v", kinds, want)
	}
	for _, o := range r.ofKind("ClusterRole") {
		var role rbacv1.ClusterRole
		r.get(t, "ClusterRole", o.GetName(), &role)
		for _, rule := range role.Rules {
			for _, f := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs} {
				if slices.Contains(f, "*") {
					t.Errorf("ClusterRole %s has a wildcard: %+v", o.GetName(), rule)
				}
			}
			if slices.Contains(rule.Verbs, "escalate") || slices.Contains(rule.Verbs, "bind") {
				if len(rule.ResourceNames) == 0 {
					t.Errorf("ClusterRole %s may escalate or bind any role: %+v", o.GetName(), rule)
				}
			}
		}
	}
	var d appsv1.Deployment
	r.get(t, "Deployment", "kubevisor-operator", &d)
	spec := d.Spec.Template.Spec
	c := container(t, spec, "operator")
	if spec.ServiceAccountName != "kubevisor-operator" || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot ||
		c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation ||
		!slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
		t.Errorf("the operator's pod is not an unprivileged one of its service account: %+v %+v", spec.SecurityContext, c.SecurityContext)
	}
	if c.Image != "kubevisor/kubevisor-operator:dev" {
		t.Errorf("image %q, want kubevisor/kubevisor-operator:dev", c.Image)
	}
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env = append(env, e.Name+"="+e.ValueFrom.FieldRef.FieldPath)
		}
	}
	if !slices.Equal(env, []string{"POD_NAMESPACE=metadata.namespace", "POD_NAME=metadata.name"}) {
		t.Errorf("downward API env %v: the operator finds its version through its pod", env)
	}
}
