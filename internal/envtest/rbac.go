package envtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// rbacMarker is the prefix of a controller-gen RBAC marker once the comment slashes are gone.
const rbacMarker = "+kubebuilder:rbac:"

// MarkerRole returns a ClusterRole called name with one rule for each +kubebuilder:rbac marker in
// files, read the way controller-gen reads them: groups, resources, resourceNames, verbs and urls
// lists separated by ';', with `groups=""` and `groups=core` naming the core API group. It fails
// the test when a file cannot be read, when a marker has a key it cannot turn into a ClusterRole
// rule (namespace= asks for a Role), or when the files hold no marker at all.
func MarkerRole(t testing.TB, name string, files ...string) *rbacv1.ClusterRole {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := markerRules(string(src))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		role.Rules = append(role.Rules, rules...)
	}
	if len(role.Rules) == 0 {
		t.Fatalf("%s: no +kubebuilder:rbac markers", strings.Join(files, ", "))
	}
	return role
}

// markerRules returns the rules of the +kubebuilder:rbac markers in src, in order.
func markerRules(src string) ([]rbacv1.PolicyRule, error) {
	var rules []rbacv1.PolicyRule
	for n, line := range strings.Split(src, "\n") {
		comment, ok := strings.CutPrefix(strings.TrimSpace(line), "//")
		if !ok {
			continue
		}
		marker, ok := strings.CutPrefix(strings.TrimSpace(comment), rbacMarker)
		if !ok {
			continue
		}
		rule, err := markerRule(marker)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// markerRule turns the key=value list of one marker into a rule.
func markerRule(marker string) (rbacv1.PolicyRule, error) {
	var rule rbacv1.PolicyRule
	for kv := range strings.SplitSeq(marker, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return rule, fmt.Errorf("marker argument %q is not key=value", kv)
		}
		var vals []string
		for val := range strings.SplitSeq(v, ";") {
			vals = append(vals, strings.Trim(val, `"`))
		}
		switch k {
		case "groups":
			for i, g := range vals {
				if g == "core" {
					vals[i] = ""
				}
			}
			rule.APIGroups = vals
		case "resources":
			rule.Resources = vals
		case "resourceNames":
			rule.ResourceNames = vals
		case "verbs":
			rule.Verbs = vals
		case "urls":
			rule.NonResourceURLs = vals
		default:
			return rule, fmt.Errorf("marker key %q is not understood here", k)
		}
	}
	return rule, nil
}

// Impersonate creates role and a ClusterRoleBinding called user that grants it to user, and
// returns a copy of the administrator's Config that impersonates user: a manager run with it has
// exactly the role's rights.
func (e *Env) Impersonate(t testing.TB, user string, role *rbacv1.ClusterRole) *rest.Config {
	t.Helper()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := e.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("grant %s to %s: %v", role.Name, user, err)
		}
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}

// ImpersonateWithMarkers is Impersonate with MarkerRole(user, files...): a controller run with
// the Config it returns proves that the +kubebuilder:rbac markers in files grant all it needs.
func (e *Env) ImpersonateWithMarkers(t testing.TB, user string, files ...string) *rest.Config {
	t.Helper()
	return e.Impersonate(t, user, MarkerRole(t, user, files...))
}
