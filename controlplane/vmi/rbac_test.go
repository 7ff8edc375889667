package vmi

import (
	"context"
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// markerRole is a ClusterRole with exactly the rules of the +kubebuilder:rbac markers in file.
func markerRole(t *testing.T, file, name string) *rbacv1.ClusterRole {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, line := range strings.Split(string(src), "\n") {
		marker, ok := strings.CutPrefix(strings.TrimSpace(line), "// +kubebuilder:rbac:")
		if !ok {
			continue
		}
		var rule rbacv1.PolicyRule
		for _, kv := range strings.Split(marker, ",") {
			k, v, _ := strings.Cut(kv, "=")
			vals := strings.Split(strings.Trim(v, `"`), ";")
			switch k {
			case "groups":
				rule.APIGroups = vals
			case "resources":
				rule.Resources = vals
			case "verbs":
				rule.Verbs = vals
			default:
				t.Fatalf("%s: marker key %q not understood by this test", file, k)
			}
		}
		role.Rules = append(role.Rules, rule)
	}
	if len(role.Rules) == 0 {
		t.Fatalf("%s has no +kubebuilder:rbac markers", file)
	}
	return role
}

// restrictedConfig returns a copy of admin that acts as a user granted only the rules of the
// markers in file, so that a controller run with it proves its markers are enough.
func restrictedConfig(t *testing.T, admin *rest.Config, c client.Client, file, user string) *rest.Config {
	t.Helper()
	role := markerRole(t, file, user)
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}

func TestMarkerRoleCoreGroup(t *testing.T) {
	role := markerRole(t, "controller.go", "x")
	for _, r := range role.Rules {
		if len(r.Resources) == 1 && r.Resources[0] == "pods" {
			if len(r.APIGroups) != 1 || r.APIGroups[0] != "" {
				t.Errorf("pods rule groups = %q, want the core group", r.APIGroups)
			}
			return
		}
	}
	t.Error("no rule for pods")
}
