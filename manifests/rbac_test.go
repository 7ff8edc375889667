package manifests_test

import (
	"io/fs"
	"maps"
	"os"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/manifests"
)

// rolesIn reads every ClusterRole and Role of the YAML files of fsys, by "Kind/namespace/name"
// with the file it is in.
func rolesIn(t *testing.T, fsys fs.FS) map[string]struct {
	file  string
	rules []rbacv1.PolicyRule
} {
	t.Helper()
	out := map[string]struct {
		file  string
		rules []rbacv1.PolicyRule
	}{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (path.Ext(p) != ".yaml" && path.Ext(p) != ".yml") {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		for _, o := range decodeAll(t, data) {
			if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
				continue
			}
			var role rbacv1.ClusterRole // a Role has the same rules
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
				t.Fatalf("%s: %s %s: %v", p, o.GetKind(), o.GetName(), err)
			}
			out[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = struct {
				file  string
				rules []rbacv1.PolicyRule
			}{p, role.Rules}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNoWildcardInRoles reads every ClusterRole and Role under manifests/ (the generated roles
// of each component and the operator, the user roles, the scrapers' role: the files the operator
// embeds and the operator's own) and fails on a wildcard in any rule: a "*" in apiGroups,
// resources, verbs, nonResourceURLs or resourceNames, alone or in a pattern ("*/scale",
// "/metrics/*").
func TestNoWildcardInRoles(t *testing.T) {
	roles := rolesIn(t, os.DirFS("."))
	for _, want := range []string{
		"ClusterRole//kubevisor-controller", "ClusterRole//kubevisor-handler", "ClusterRole//kubevisor-api",
		"Role/kubevisor-system/kubevisor-api", "ClusterRole//kubevisor-operator", "ClusterRole//" + metricsauth.ReaderRole,
		"ClusterRole//kubevisor.io:view", "ClusterRole//kubevisor.io:edit", "ClusterRole//kubevisor.io:admin", "ClusterRole//kubevisor.io:migrate",
	} {
		if _, ok := roles[want]; !ok {
			t.Errorf("no %s under manifests/: the test reads fewer roles than it should (found %v)", want, slices.Sorted(maps.Keys(roles)))
		}
	}
	// The operator installs the roles of its embedded files: the same files, read through the
	// embedding.
	embedded := rolesIn(t, manifests.FS)
	for key, r := range embedded {
		if got, ok := roles[key]; !ok || !reflect.DeepEqual(got.rules, r.rules) {
			t.Errorf("%s of the embedded %s is not the one under manifests/", key, r.file)
		}
	}
	if len(embedded) == 0 {
		t.Error("the operator's embedded manifests hold no role")
	}
	for key, r := range roles {
		for i, rule := range r.rules {
			for field, values := range map[string][]string{
				"apiGroups": rule.APIGroups, "resources": rule.Resources, "verbs": rule.Verbs,
				"nonResourceURLs": rule.NonResourceURLs, "resourceNames": rule.ResourceNames,
			} {
				for _, v := range values {
					if strings.Contains(v, "*") {
						t.Errorf("%s (%s), rule %d: wildcard %q in %s", key, r.file, i, v, field)
					}
				}
			}
		}
	}
}

// TestMetricsAccess: every component's role can review the tokens of its /metrics requests
// (TokenReview, SubjectAccessReview), the scrapers' role grants get on /metrics and nothing else,
// and every workload serves /metrics on a port named https-metrics that no probe uses (the
// probes stay plain HTTP on their own port).
func TestMetricsAccess(t *testing.T) {
	roles := rolesIn(t, os.DirFS("."))
	for _, key := range []string{"kubevisor-controller", "kubevisor-handler", "kubevisor-api", "kubevisor-operator"} {
		rules := roles["ClusterRole//"+key].rules
		if !allows(rules, "authentication.k8s.io", "tokenreviews", "create", "") ||
			!allows(rules, "authorization.k8s.io", "subjectaccessreviews", "create", "") {
			t.Errorf("ClusterRole %s cannot create tokenreviews and subjectaccessreviews: its /metrics could not authorize a request", key)
		}
	}
	reader := roles["ClusterRole//"+metricsauth.ReaderRole].rules
	if want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}; !reflect.DeepEqual(reader, want) {
		t.Errorf("ClusterRole %s: rules %+v, want %+v", metricsauth.ReaderRole, reader, want)
	}

	specs := render(t, drivers(t), "").podSpecs(t)
	var d struct {
		Spec struct {
			Template struct {
				Spec corev1.PodSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	operator := rendered{objs: decodeAll(t, readFile(t, "operator/operator.yaml"))}
	operator.get(t, "Deployment", "kubevisor-operator", &d)
	specs["Deployment/kubevisor-operator"] = d.Spec.Template.Spec
	for _, key := range []string{"Deployment/kubevisor-controller", "Deployment/kubevisor-api", "DaemonSet/kubevisor-handler", "Deployment/kubevisor-operator"} {
		spec, ok := specs[key]
		if !ok {
			t.Errorf("no %s", key)
			continue
		}
		c := spec.Containers[0]
		addr, ok := flagValue(c, "--metrics-bind-address")
		if !ok {
			addr, ok = flagValue(c, "--metrics-addr")
		}
		_, port, _ := strings.Cut(addr, ":")
		n, err := strconv.Atoi(port)
		if !ok || err != nil {
			t.Errorf("%s container %s: metrics address %q, want :<port>", key, c.Name, addr)
			continue
		}
		var named bool
		for _, p := range c.Ports {
			if p.ContainerPort == int32(n) {
				named = p.Name == "https-metrics"
			}
		}
		if !named {
			t.Errorf("%s container %s: metrics port %d is not the container port https-metrics", key, c.Name, n)
		}
		for what, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if probe == nil || probe.HTTPGet == nil {
				t.Errorf("%s container %s: no HTTP %s probe", key, c.Name, what)
				continue
			}
			if p := probe.HTTPGet.Port; p == intstr.FromString("https-metrics") || p == intstr.FromInt32(int32(n)) || probe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
				t.Errorf("%s container %s: the %s probe is on the metrics port or HTTPS: the probes stay plain HTTP on their own port", key, c.Name, what)
			}
		}
	}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
