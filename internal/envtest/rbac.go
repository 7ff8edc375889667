package envtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
		for _, r := range rules {
			if r.namespace != "" {
				t.Fatalf("%s: a namespace= marker asks for a Role: use ImpersonateWithMarkers", file)
			}
			role.Rules = append(role.Rules, r.PolicyRule)
		}
	}
	if len(role.Rules) == 0 {
		t.Fatalf("%s: no +kubebuilder:rbac markers", strings.Join(files, ", "))
	}
	return role
}

// markerRule is one marker's rule and, for a namespace= marker, the namespace of its Role.
type markerRule struct {
	rbacv1.PolicyRule
	namespace string
}

// markerRules returns the rules of the +kubebuilder:rbac markers in src, in order.
func markerRules(src string) ([]markerRule, error) {
	var rules []markerRule
	for n, line := range strings.Split(src, "\n") {
		comment, ok := strings.CutPrefix(strings.TrimSpace(line), "//")
		if !ok {
			continue
		}
		marker, ok := strings.CutPrefix(strings.TrimSpace(comment), rbacMarker)
		if !ok {
			continue
		}
		rule, err := parseMarker(marker)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// parseMarker turns the key=value list of one marker into a rule.
func parseMarker(marker string) (markerRule, error) {
	var rule markerRule
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
		case "namespace":
			rule.namespace = v
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

// ImpersonateWithMarkers is Impersonate with the rules of the +kubebuilder:rbac markers in
// files: a ClusterRole called user for the cluster-wide markers and, as controller-gen makes
// them, a Role called user in each namespace= marker's namespace (created when missing), bound
// to user. A controller run with the Config it returns proves that the markers grant all it
// needs.
func (e *Env) ImpersonateWithMarkers(t testing.TB, user string, files ...string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}}
	roles := map[string]*rbacv1.Role{}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := markerRules(string(src))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, r := range rules {
			if r.namespace == "" {
				role.Rules = append(role.Rules, r.PolicyRule)
				continue
			}
			if roles[r.namespace] == nil {
				roles[r.namespace] = &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: r.namespace}}
			}
			roles[r.namespace].Rules = append(roles[r.namespace].Rules, r.PolicyRule)
		}
	}
	if len(role.Rules) == 0 && len(roles) == 0 {
		t.Fatalf("%s: no +kubebuilder:rbac markers", strings.Join(files, ", "))
	}
	for ns, r := range roles {
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if err := e.Client.Create(ctx, nsObj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		for _, o := range []client.Object{r, binding} {
			if err := e.Client.Create(ctx, o); err != nil {
				t.Fatalf("grant the role %s/%s to %s: %v", ns, user, user, err)
			}
		}
	}
	return e.Impersonate(t, user, role)
}
