package envtest

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestMarkerRules(t *testing.T) {
	src := `package x

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=apps;batch,resources=deployments;jobs;jobs/status,verbs=get;patch
//+kubebuilder:rbac:groups=core,resources=configmaps,resourceNames=a;b,verbs=get
	// +kubebuilder:rbac:urls=/healthz,verbs=get
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=kubevisor-system,resources=leases,verbs=get
// kubebuilder:rbac:groups=ignored,resources=notamarker,verbs=get
var s = "+kubebuilder:rbac:groups=ignored,resources=notacomment,verbs=get"
`
	got, err := markerRules(src)
	if err != nil {
		t.Fatal(err)
	}
	want := []markerRule{
		{PolicyRule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}}},
		{PolicyRule: rbacv1.PolicyRule{APIGroups: []string{"apps", "batch"}, Resources: []string{"deployments", "jobs", "jobs/status"}, Verbs: []string{"get", "patch"}}},
		{PolicyRule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"a", "b"}, Verbs: []string{"get"}}},
		{PolicyRule: rbacv1.PolicyRule{NonResourceURLs: []string{"/healthz"}, Verbs: []string{"get"}}},
		{PolicyRule: rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}}, namespace: "kubevisor-system"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rules:\n got %+v\nwant %+v", got, want)
	}
}

func TestMarkerRulesRefuses(t *testing.T) {
	for _, tc := range []struct{ marker, want string }{
		{"groups=apps,resources=deployments,verbs=get,foo=bar", `"foo"`},
		{"groups=apps,resources,verbs=get", `"resources" is not key=value`},
	} {
		_, err := markerRules("// +kubebuilder:rbac:" + tc.marker + "\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%s: error %v, want one naming %s on line 1", tc.marker, err, tc.want)
		}
	}
}

func TestMarkerRoleJoinsFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.go"), filepath.Join(dir, "b.go")
	for file, marker := range map[string]string{
		a: "// +kubebuilder:rbac:groups=\"\",resources=pods,verbs=get\n",
		b: "// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines,verbs=list\n",
	} {
		if err := os.WriteFile(file, []byte(marker), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	role := MarkerRole(t, "both", a, b)
	if role.Name != "both" || len(role.Rules) != 2 || role.Rules[0].Resources[0] != "pods" || role.Rules[1].Resources[0] != "virtualmachines" {
		t.Errorf("role = %+v", role)
	}
}

// TestImpersonateWithMarkers checks that the Config grants what the markers say and no more.
func TestImpersonateWithMarkers(t *testing.T) {
	env := Start(t, Options{})
	file := filepath.Join(t.TempDir(), "controller.go")
	if err := os.WriteFile(file, []byte("// +kubebuilder:rbac:groups=\"\",resources=pods,verbs=list\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.ImpersonateWithMarkers(t, "pod-lister", file), client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.List(ctx, &corev1.PodList{}); err != nil {
		t.Errorf("list pods, granted: %v", err)
	}
	if err := c.List(ctx, &corev1.ConfigMapList{}); !apierrors.IsForbidden(err) {
		t.Errorf("list configmaps, not granted: %v, want Forbidden", err)
	}
}
