package vmirs

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

// restrictedConfig returns a copy of admin that acts as a user granted exactly the rules of the
// +kubebuilder:rbac markers in file, so the controller under test proves its markers suffice.
func restrictedConfig(t *testing.T, admin *rest.Config, c client.Client, file, user string) *rest.Config {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}}
	for _, line := range strings.Split(string(src), "\n") {
		marker, ok := strings.CutPrefix(strings.TrimSpace(line), "// +kubebuilder:rbac:")
		if !ok {
			continue
		}
		var rule rbacv1.PolicyRule
		for _, kv := range strings.Split(marker, ",") {
			k, v, _ := strings.Cut(kv, "=")
			vals := strings.Split(v, ";")
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
