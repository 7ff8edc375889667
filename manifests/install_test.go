// Package manifests_test checks the install manifests (manifests/install and its driver
// components) as kustomize renders them, with kubectl's built-in kustomize: no cluster needed.
package manifests_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	subresourcesv1alpha1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/drivers/hostdev"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

const (
	namespace = "kubevisor-system"
	base      = "install"
)

// clusterScoped are the kinds the install renders that have no namespace.
var clusterScoped = map[string]bool{
	"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"MutatingWebhookConfiguration": true, "ValidatingWebhookConfiguration": true, "HypervisorClass": true,
	"APIService": true,
}

// elsewhere are the namespaced objects the install puts outside kubevisor-system, by
// "Kind/name", with their namespace.
var elsewhere = map[string]string{
	// The aggregated API reads the front proxy's settings from kube-system.
	"RoleBinding/kubevisor-api:extension-apiserver-authentication-reader": "kube-system",
}

// builtinBindings are the bindings to roles Kubernetes brings, by "Kind/name" of the binding,
// with the role they bind: the delegated authentication and authorization of kubevisor-api's
// aggregated API.
var builtinBindings = map[string]string{
	"ClusterRoleBinding/kubevisor-api:system:auth-delegator":              "ClusterRole/system:auth-delegator",
	"RoleBinding/kubevisor-api:extension-apiserver-authentication-reader": "Role/extension-apiserver-authentication-reader",
}

// userRoles are the generated roles for users, with the built-in role each is aggregated into.
var userRoles = map[string]string{
	"ClusterRole/kubevisor.io:view":    "view",
	"ClusterRole/kubevisor.io:edit":    "edit",
	"ClusterRole/kubevisor.io:admin":   "admin",
	"ClusterRole/kubevisor.io:migrate": "admin",
}

// scraperRole is the generated role of Prometheus and the like (get /metrics): the install binds
// it to nobody.
const scraperRole = "ClusterRole/" + metricsauth.ReaderRole

// hypervisorDrivers are the hypervisor driver components, each bringing its HypervisorClass,
// and whether that class is the default (exactly one is).
var hypervisorDrivers = map[string]bool{"qmp": true, "libvirt": false, "fake": false}

// drivers lists the driver components (install/drivers/<name>).
func drivers(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(base, "drivers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(base, "drivers", e.Name(), "kustomization.yaml")); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatal("no driver component in install/drivers")
	}
	return out
}

// rendered is one kustomize build of the install.
type rendered struct {
	objs []*unstructured.Unstructured
}

// render builds the base with the given driver components (as hack/install.sh does) and
// extra kustomization lines.
func render(t *testing.T, components []string, extra string) rendered {
	t.Helper()
	kubectl := testenv.Command(t, "kubectl", "kubectl (its built-in kustomize renders the overlays)")
	dir := t.TempDir()
	abs, err := filepath.Abs(base)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs) // kustomize takes no absolute roots
	if err != nil {
		t.Fatal(err)
	}
	var k strings.Builder
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel + "\n")
	if len(components) > 0 {
		k.WriteString("components:\n")
		for _, c := range components {
			k.WriteString("- " + rel + "/drivers/" + c + "\n")
		}
	}
	k.WriteString(extra)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize with components %v: %v\n%s", components, err, stderr.String())
	}
	return rendered{objs: decodeAll(t, stdout.Bytes())}
}

func decodeAll(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

func (r rendered) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r rendered) get(t *testing.T, kind, name string, into any) {
	t.Helper()
	for _, o := range r.ofKind(kind) {
		if o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s in the rendered install", kind, name)
}

// podSpecs are the pod templates of the workloads, by "Kind/name".
func (r rendered) podSpecs(t *testing.T) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for _, o := range r.ofKind("Deployment") {
		var d appsv1.Deployment
		r.get(t, "Deployment", o.GetName(), &d)
		out["Deployment/"+d.Name] = d.Spec.Template.Spec
	}
	for _, o := range r.ofKind("DaemonSet") {
		var d appsv1.DaemonSet
		r.get(t, "DaemonSet", o.GetName(), &d)
		out["DaemonSet/"+d.Name] = d.Spec.Template.Spec
	}
	return out
}

// handlerConfig writes the handler ConfigMap's files to a directory and loads it as
// kubevisor-handler serve --config does.
func (r rendered) handlerConfig(t *testing.T) handler.Config {
	t.Helper()
	cms := r.ofKind("ConfigMap")
	if len(cms) != 1 {
		t.Fatalf("want one ConfigMap (the handler's), got %d", len(cms))
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", cms[0].GetName(), &cm)
	dir := t.TempDir()
	for name, data := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := handler.LoadConfigDir(dir)
	if err != nil {
		t.Fatalf("handler configuration of ConfigMap %s: %v", cm.Name, err)
	}
	return cfg
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func flagValue(c corev1.Container, flag string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestNamespaces(t *testing.T) {
	r := render(t, drivers(t), "")
	for _, o := range r.objs {
		want := namespace
		if clusterScoped[o.GetKind()] {
			want = ""
		}
		if ns, ok := elsewhere[o.GetKind()+"/"+o.GetName()]; ok {
			want = ns
		}
		if got := o.GetNamespace(); got != want {
			t.Errorf("%s %s: namespace %q, want %q", o.GetKind(), o.GetName(), got, want)
		}
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		for _, o := range r.ofKind(kind) {
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for _, h := range hooks {
				ns, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "namespace")
				name, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "name")
				if ns != namespace || name != "kubevisor-api" {
					t.Errorf("%s %s: webhook service %s/%s, want %s/kubevisor-api", kind, o.GetName(), ns, name, namespace)
				}
			}
		}
	}
	var svc corev1.Service
	r.get(t, "Service", "kubevisor-api", &svc)
}

// generatedRoles reads the roles make generate writes, by "Kind/name".
func generatedRoles(t *testing.T) map[string][]rbacv1.PolicyRule {
	t.Helper()
	out := map[string][]rbacv1.PolicyRule{}
	for _, f := range []string{"rbac/controller/role.yaml", "rbac/handler/role.yaml", "webhook/role.yaml",
		"rbac/view/role.yaml", "rbac/edit/role.yaml", "rbac/admin/role.yaml", "rbac/migrate/role.yaml",
		"rbac/metrics-reader/role.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeAll(t, data) {
			var rules struct {
				Rules []rbacv1.PolicyRule `json:"rules"`
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rules); err != nil {
				t.Fatal(err)
			}
			out[o.GetKind()+"/"+o.GetName()] = rules.Rules
		}
	}
	return out
}

func TestServiceAccountsBoundOnlyToTheirGeneratedRoles(t *testing.T) {
	r := render(t, drivers(t), "")
	generated := generatedRoles(t)

	// The rendered roles are exactly the generated ones: the install adds no role of its own.
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range r.ofKind(kind) {
			want, ok := generated[kind+"/"+o.GetName()]
			if !ok {
				t.Errorf("%s %s is not one of the generated roles (manifests/rbac, manifests/webhook)", kind, o.GetName())
				continue
			}
			var got struct {
				Rules []rbacv1.PolicyRule `json:"rules"`
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Rules, want) {
				t.Errorf("%s %s: rules differ from the generated role", kind, o.GetName())
			}
		}
	}

	sas := map[string]bool{}
	for _, o := range r.ofKind("ServiceAccount") {
		sas[o.GetName()] = true
	}
	if want := []string{"kubevisor-api", "kubevisor-controller", "kubevisor-handler"}; !slices.Equal(slices.Sorted(maps.Keys(sas)), want) {
		t.Errorf("ServiceAccounts %v, want one per component %v", slices.Sorted(maps.Keys(sas)), want)
	}
	boundTo := map[string][]string{} // SA → roles
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range r.ofKind(kind) {
			var b rbacv1.RoleBinding // same shape as ClusterRoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			role := b.RoleRef.Kind + "/" + b.RoleRef.Name
			builtin, isBuiltin := builtinBindings[kind+"/"+b.Name]
			if isBuiltin && role != builtin {
				t.Errorf("%s %s binds %s, want %s", kind, b.Name, role, builtin)
			}
			if _, ok := generated[role]; !ok && !isBuiltin {
				t.Errorf("%s %s binds %s, which is not a generated role", kind, b.Name, role)
			}
			if _, ok := userRoles[role]; ok {
				t.Errorf("%s %s binds the user role %s: users get it through the built-in roles", kind, b.Name, role)
			}
			if role == scraperRole {
				t.Errorf("%s %s binds %s: the admin binds it to the scraper", kind, b.Name, role)
			}
			if len(b.Subjects) != 1 {
				t.Errorf("%s %s: %d subjects, want its one ServiceAccount", kind, b.Name, len(b.Subjects))
				continue
			}
			s := b.Subjects[0]
			if s.Kind != "ServiceAccount" || s.Namespace != namespace || !sas[s.Name] {
				t.Errorf("%s %s: subject %s %s/%s is not a Kubevisor ServiceAccount", kind, b.Name, s.Kind, s.Namespace, s.Name)
				continue
			}
			// Each component's generated role carries its own name; the built-in roles are
			// kubevisor-api's.
			if isBuiltin {
				if s.Name != "kubevisor-api" {
					t.Errorf("%s %s grants %s to %s, want kubevisor-api", kind, b.Name, role, s.Name)
				}
				continue
			}
			if b.RoleRef.Name != s.Name {
				t.Errorf("%s %s binds ServiceAccount %s to %s: another component's role", kind, b.Name, s.Name, role)
			}
			boundTo[s.Name] = append(boundTo[s.Name], role)
		}
	}
	for sa := range sas {
		if len(boundTo[sa]) == 0 {
			t.Errorf("ServiceAccount %s is bound to no role", sa)
		}
	}
	for role := range generated {
		if _, ok := userRoles[role]; ok || role == scraperRole {
			continue
		}
		found := false
		for _, roles := range boundTo {
			found = found || slices.Contains(roles, role)
		}
		if !found {
			t.Errorf("generated role %s is bound to no ServiceAccount", role)
		}
	}
	// Each workload runs as its own ServiceAccount.
	for key, spec := range r.podSpecs(t) {
		if want := key[strings.Index(key, "/")+1:]; spec.ServiceAccountName != want {
			t.Errorf("%s runs as ServiceAccount %q, want %q", key, spec.ServiceAccountName, want)
		}
	}
}

func TestPrivileges(t *testing.T) {
	r := render(t, drivers(t), "")
	for key, spec := range r.podSpecs(t) {
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
			// Only the handler: network namespaces, taps, nftables, its drivers.
			if want := key == "DaemonSet/kubevisor-handler" && c.Name == "handler"; privileged != want {
				t.Errorf("%s container %s: privileged %v, want %v", key, c.Name, privileged, want)
			}
			if strings.Contains(c.Image, "kubevisor-launcher") {
				t.Errorf("%s container %s runs the launcher image", key, c.Name)
			}
		}
		if spec.HostPID != (key == "DaemonSet/kubevisor-handler") || spec.HostNetwork {
			t.Errorf("%s: hostPID %v hostNetwork %v", key, spec.HostPID, spec.HostNetwork)
		}
	}
}

func TestHandlerDaemonSet(t *testing.T) {
	r := render(t, drivers(t), "")
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "kubevisor-handler", &ds)
	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxSurge == nil || u.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("update strategy %+v: want a RollingUpdate with maxSurge 0 (never two handlers on a node)", u)
	}
	spec := ds.Spec.Template.Spec
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "node-role.kubernetes.io/control-plane" && tl.Operator == corev1.TolerationOpExists
	}) {
		t.Error("no toleration of control-plane nodes")
	}
	h := container(t, spec, "handler")
	if len(h.Command) < 2 || h.Command[0] != "kubevisor-handler" || h.Command[1] != "serve" {
		t.Errorf("handler command %v", h.Command)
	}
	// The same per-VMI directory on the node, in the handler and in the launcher pods.
	hostDir, ok := flagValue(h, "--host-state-dir")
	if !ok {
		t.Fatal("handler has no --host-state-dir")
	}
	var dep appsv1.Deployment
	r.get(t, "Deployment", "kubevisor-controller", &dep)
	if got, _ := flagValue(container(t, dep.Spec.Template.Spec, "controller"), "--host-state-dir"); got != hostDir {
		t.Errorf("controller --host-state-dir %q, handler's %q", got, hostDir)
	}
	var mount *corev1.VolumeMount
	for i, m := range h.VolumeMounts {
		if m.MountPath == hostDir {
			mount = &h.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("handler does not mount %s", hostDir)
	}
	if mount.MountPropagation == nil || *mount.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("%s mount: propagation %v, want Bidirectional (containerDisk disks)", hostDir, mount.MountPropagation)
	}
	for _, v := range spec.Volumes {
		if v.Name == mount.Name && (v.HostPath == nil || v.HostPath.Path != hostDir) {
			t.Errorf("volume %s is not the hostPath %s", v.Name, hostDir)
		}
	}
	configDir, _ := flagValue(h, "--config")
	if !slices.ContainsFunc(h.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == configDir }) {
		t.Errorf("--config %q is not a mounted volume", configDir)
	}
	if _, ok := flagValue(h, "--plugin-bin-dir"); !ok {
		t.Error("handler has no --plugin-bin-dir: no driver would be found")
	}
	d := container(t, spec, "deviceplugins")
	if !slices.ContainsFunc(d.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/var/lib/kubelet/device-plugins" }) {
		t.Error("deviceplugins does not mount the kubelet's device plugin directory")
	}
}

func TestImages(t *testing.T) {
	for _, tc := range []struct{ name, extra, tag string }{
		{"default", "", "dev"},
		{"overlay tag", "images:\n- name: kubevisor/kubevisor-controller\n  newTag: v1\n- name: kubevisor/kubevisor-api\n  newTag: v1\n" +
			"- name: kubevisor/kubevisor-handler\n  newTag: v1\n- name: kubevisor/kubevisor-launcher\n  newTag: v1\n", "v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, drivers(t), tc.extra)
			for key, spec := range r.podSpecs(t) {
				for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
					if !strings.HasPrefix(c.Image, "kubevisor/kubevisor-") || !strings.HasSuffix(c.Image, ":"+tc.tag) {
						t.Errorf("%s container %s: image %q, want kubevisor/kubevisor-*:%s", key, c.Name, c.Image, tc.tag)
					}
					if c.ImagePullPolicy != corev1.PullIfNotPresent {
						t.Errorf("%s container %s: pull policy %q", key, c.Name, c.ImagePullPolicy)
					}
				}
			}
			// The launcher image reaches the controller's --launcher-image through its environment,
			// which the images transformer rewrites too (kustomizeconfig.yaml).
			var dep appsv1.Deployment
			r.get(t, "Deployment", "kubevisor-controller", &dep)
			c := container(t, dep.Spec.Template.Spec, "controller")
			if v, _ := flagValue(c, "--launcher-image"); v != "$(KUBEVISOR_LAUNCHER_IMAGE)" {
				t.Errorf("--launcher-image=%q", v)
			}
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBEVISOR_LAUNCHER_IMAGE" })
			if want := "kubevisor/kubevisor-launcher:" + tc.tag; i < 0 || c.Env[i].Value != want {
				t.Errorf("KUBEVISOR_LAUNCHER_IMAGE: %v, want %s", c.Env, want)
			}
		})
	}
}

func TestDriverComponents(t *testing.T) {
	kinds := func(s handler.DriverSet) map[string]string {
		out := map[string]string{}
		for k, v := range map[string]string{"hypervisor": strings.Join(s.HypervisorNames(), ","), "network": s.Network, "storage": s.Storage, "device": strings.Join(s.DeviceNames(), ",")} {
			if v != "" {
				out[k] = v
			}
		}
		return out
	}
	t.Run("base", func(t *testing.T) {
		r := render(t, nil, "")
		if got := kinds(r.handlerConfig(t).Drivers); len(got) != 0 {
			t.Errorf("the base loads drivers %v, want none", got)
		}
		if n := len(r.ofKind("HypervisorClass")); n != 0 {
			t.Errorf("the base has %d HypervisorClasses", n)
		}
	})
	all := drivers(t)
	for _, name := range all {
		t.Run(name, func(t *testing.T) {
			r := render(t, []string{name}, "")
			got := kinds(r.handlerConfig(t).Drivers)
			if len(got) != 1 || !slices.Contains(slices.Collect(maps.Values(got)), name) {
				t.Errorf("component %s: handler drivers %v, want %s alone", name, got, name)
			}
			classes := r.ofKind("HypervisorClass")
			isDefault, hypervisor := hypervisorDrivers[name]
			if !hypervisor {
				if len(classes) != 0 {
					t.Errorf("component %s (not a hypervisor) brings %d HypervisorClasses", name, len(classes))
				}
				return
			}
			if got["hypervisor"] != name {
				t.Errorf("component %s does not configure itself as the hypervisor driver: %v", name, got)
			}
			checkClass(t, r, name, isDefault)
		})
	}
	t.Run("all", func(t *testing.T) {
		r := render(t, all, "")
		got := r.handlerConfig(t).Drivers
		if !slices.Contains(got.HypervisorNames(), "qmp") || got.Network != "cni" || got.Storage != "local" {
			t.Errorf("drivers %+v, want qmp, cni, local", got)
		}
		// The handler loads every hypervisor driver component (handler.d parts add up), and
		// one class at most is the default: VMIs that name no class need exactly one.
		defaults := 0
		for _, c := range r.ofKind("HypervisorClass") {
			var class v1alpha1.HypervisorClass
			r.get(t, "HypervisorClass", c.GetName(), &class)
			if v1alpha1.IsDefaultClass(&class) {
				defaults++
			}
		}
		for name := range hypervisorDrivers {
			if !slices.Contains(got.HypervisorNames(), name) {
				t.Errorf("hypervisor driver component %s not among the handler's hypervisor drivers %v", name, got.HypervisorNames())
			}
		}
		if defaults != 1 {
			t.Errorf("all components: %d default HypervisorClasses, want 1", defaults)
		}
	})
}

// checkClass checks the component's HypervisorClass (the default one or not), and that a launcher pod
// built for it (by the controller's own builder, with the install's launcher image) is not
// privileged and gets its devices from the device plugins the handler DaemonSet runs.
// hostdevResources are the resources the hostdev driver component configures, and checks
// that the deviceplugins container reads the handler's configuration to find its driver.
func hostdevResources(t *testing.T) []string {
	t.Helper()
	r := render(t, []string{"hostdev"}, "")
	cfg := r.handlerConfig(t)
	if cfg.Drivers.Device != hostdev.Name {
		t.Fatalf("the hostdev component configures device driver %q", cfg.Drivers.Device)
	}
	var hc hostdev.Config
	if err := json.Unmarshal(cfg.DriverConfig[hostdev.Name], &hc); err != nil {
		t.Fatalf("driverConfig.hostdev: %v", err)
	}
	chars := hc.CharDevices
	if chars == nil {
		chars = hostdev.DefaultCharDevices()
	}
	var out []string
	for _, c := range chars {
		out = append(out, strings.TrimPrefix(c.ResourceName, v1alpha1.DeviceResourcePrefix))
	}
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "kubevisor-handler", &ds)
	spec := ds.Spec.Template.Spec
	dp := container(t, spec, "deviceplugins")
	conf, _ := flagValue(dp, "--handler-config")
	h := container(t, spec, "handler")
	if hconf, _ := flagValue(h, "--config"); conf == "" || conf != hconf {
		t.Errorf("deviceplugins --handler-config %q, handler --config %q: want the same configuration", conf, hconf)
	}
	for _, c := range []corev1.Container{h, dp} {
		for _, p := range []string{hc.DevRoot + "/dev", hc.SysfsRoot} {
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == p }) {
				t.Errorf("container %s does not mount %s, where hostdev reads the host's devices", c.Name, p)
			}
		}
	}
	return out
}

func checkClass(t *testing.T, r rendered, driver string, isDefault bool) {
	t.Helper()
	classes := r.ofKind("HypervisorClass")
	if len(classes) != 1 {
		t.Fatalf("component %s: %d HypervisorClasses, want its one", driver, len(classes))
	}
	var class v1alpha1.HypervisorClass
	r.get(t, "HypervisorClass", classes[0].GetName(), &class)
	if class.Driver != driver || v1alpha1.IsDefaultClass(&class) != isDefault {
		t.Errorf("HypervisorClass %s: driver %q, default annotation %q, want driver %q, default %v", class.Name, class.Driver, class.Annotations[v1alpha1.IsDefaultHypervisorClassAnnotation], driver, isDefault)
	}
	if class.Overhead == nil || class.Overhead.PodFixed.Memory().IsZero() {
		t.Errorf("HypervisorClass %s has no memory overhead", class.Name)
	}
	// The device plugins serve the device driver's resources: the hostdev component's.
	advertised := hostdevResources(t)
	for _, d := range class.DeviceResources {
		name := strings.TrimPrefix(string(d), v1alpha1.DeviceResourcePrefix)
		if !slices.Contains(advertised, name) {
			t.Errorf("HypervisorClass %s requests %s, which the hostdev component's device driver does not offer (%v)", class.Name, d, advertised)
		}
	}

	var dep appsv1.Deployment
	r.get(t, "Deployment", "kubevisor-controller", &dep)
	c := container(t, dep.Spec.Template.Spec, "controller")
	hostDir, _ := flagValue(c, "--host-state-dir")
	image := c.Env[slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBEVISOR_LAUNCHER_IMAGE" })].Value
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Name, vmi.Namespace, vmi.UID = "demo", "default", "0b7c1e2a-7f4e-4d8a-9a53-0d5e6f7a8b9c"
	guest := resource.MustParse("256Mi")
	vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: &guest}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "disk", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}}}}
	pod, err := launcherpod.Build(vmi, &class, launcherpod.Config{LauncherImage: image, HostStateDir: hostDir})
	if err != nil {
		t.Fatalf("launcher pod for HypervisorClass %s: %v", class.Name, err)
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("launcher pod container %s may be privileged: %+v", c.Name, sc)
		}
	}
	if pod.Spec.HostPID || pod.Spec.HostNetwork || pod.Spec.HostIPC {
		t.Error("launcher pod shares a host namespace")
	}
	compute := container(t, pod.Spec, layout.ComputeContainer)
	for _, d := range class.DeviceResources {
		if q := compute.Resources.Limits[d]; q.Value() != 1 {
			t.Errorf("launcher container does not request %s", d)
		}
	}
}

// allows says whether rules grant verb on group/resource (name empty: any object).
func allows(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	for _, r := range rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) &&
			(len(r.ResourceNames) == 0 || (name != "" && slices.Contains(r.ResourceNames, name))) {
			return true
		}
	}
	return false
}

// TestAPIService: the aggregated API is registered for kubevisor-api's Service on a port the
// Service and the container have, with TLS verified against a bundle kubevisor-api injects.
func TestAPIService(t *testing.T) {
	r := render(t, drivers(t), "")
	var svc apiregistrationService
	r.get(t, "APIService", "v1alpha1."+subresourcesv1alpha1.GroupName, &svc)
	s := svc.Spec
	if s.Group != subresourcesv1alpha1.GroupName || s.Version != subresourcesv1alpha1.GroupVersion.Version {
		t.Errorf("APIService for %s/%s", s.Group, s.Version)
	}
	if s.Service == nil || s.Service.Name != "kubevisor-api" || s.Service.Namespace != namespace || s.Service.Port == nil {
		t.Fatalf("APIService service %+v, want kubevisor-api/%s with a port", s.Service, namespace)
	}
	if s.InsecureSkipTLSVerify || len(s.CABundle) != 0 {
		t.Errorf("insecureSkipTLSVerify %v, caBundle %d bytes: want verification with the bundle kubevisor-api injects", s.InsecureSkipTLSVerify, len(s.CABundle))
	}
	if s.GroupPriorityMinimum <= 0 || s.VersionPriority <= 0 {
		t.Errorf("groupPriorityMinimum %d, versionPriority %d: both must be positive", s.GroupPriorityMinimum, s.VersionPriority)
	}

	var service corev1.Service
	r.get(t, "Service", "kubevisor-api", &service)
	i := slices.IndexFunc(service.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *s.Service.Port })
	if i < 0 {
		t.Fatalf("Service kubevisor-api has no port %d", *s.Service.Port)
	}
	target := service.Spec.Ports[i].TargetPort
	var dep appsv1.Deployment
	r.get(t, "Deployment", "kubevisor-api", &dep)
	c := container(t, dep.Spec.Template.Spec, "api")
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return (target.StrVal != "" && p.Name == target.StrVal) || (target.StrVal == "" && p.ContainerPort == target.IntVal)
	}) {
		t.Errorf("Service port %d targets %s, which the kubevisor-api container does not expose", *s.Service.Port, target.String())
	}
}

// apiregistrationService is the part of an APIService the test reads (the module has no
// aggregator types).
type apiregistrationService struct {
	Spec struct {
		Service *struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
			Port      *int32 `json:"port"`
		} `json:"service"`
		Group                 string `json:"group"`
		Version               string `json:"version"`
		InsecureSkipTLSVerify bool   `json:"insecureSkipTLSVerify"`
		CABundle              []byte `json:"caBundle"`
		GroupPriorityMinimum  int32  `json:"groupPriorityMinimum"`
		VersionPriority       int32  `json:"versionPriority"`
	} `json:"spec"`
}

// TestKubevisorAPIRights: kubevisor-api's generated roles grant what its certificate rotation
// and aggregated API do, and the Secret rights are limited to the handlers' Secret in
// kubevisor-system.
func TestKubevisorAPIRights(t *testing.T) {
	generated := generatedRoles(t)
	cluster, ns := generated["ClusterRole/kubevisor-api"], generated["Role/kubevisor-api"]
	for _, tc := range []struct {
		rules                 []rbacv1.PolicyRule
		group, resource, name string
		verbs                 []string
	}{
		{ns, "", "secrets", nodeapi.HandlerCertSecret, []string{"get", "update"}},
		{ns, "", "secrets", "", []string{"create"}},
		{ns, "", "pods", "", []string{"list"}},
		{cluster, "apiregistration.k8s.io", "apiservices", "v1alpha1." + subresourcesv1alpha1.GroupName, []string{"get", "patch"}},
		{cluster, "kubevisor.io", "virtualmachines", "", []string{"get", "patch"}},
		{cluster, "kubevisor.io", "virtualmachineinstances", "", []string{"get", "patch", "delete"}},
		{cluster, "kubevisor.io", "virtualmachines/status", "", []string{"patch"}},
		{cluster, "kubevisor.io", "virtualmachineinstancemigrations", "", []string{"create", "list", "delete"}},
	} {
		for _, verb := range tc.verbs {
			if !allows(tc.rules, tc.group, tc.resource, verb, tc.name) {
				t.Errorf("kubevisor-api may not %s %s.%s %q", verb, tc.resource, tc.group, tc.name)
			}
		}
	}
	for _, rules := range [][]rbacv1.PolicyRule{cluster, ns} {
		if allows(rules, "", "secrets", "get", "someone-elses") || allows(rules, "", "secrets", "list", "") {
			t.Error("kubevisor-api may read Secrets other than the handlers'")
		}
	}
	if allows(cluster, "", "pods", "list", "") {
		t.Error("kubevisor-api may list pods outside kubevisor-system")
	}
}

// TestUserRoles: the four user roles carry the label that aggregates each into its built-in
// role, and grant what their names say: view reads, edit writes VMs and reaches into them,
// admin adds collections, migrate migrates; HypervisorClasses are written by none.
func TestUserRoles(t *testing.T) {
	r := render(t, drivers(t), "")
	roles := map[string][]rbacv1.PolicyRule{}
	for key, into := range userRoles {
		var role rbacv1.ClusterRole
		r.get(t, "ClusterRole", strings.TrimPrefix(key, "ClusterRole/"), &role)
		var aggregated []string
		for k, v := range role.Labels {
			if to, ok := strings.CutPrefix(k, "rbac.authorization.k8s.io/aggregate-to-"); ok && v == "true" {
				aggregated = append(aggregated, to)
			}
		}
		if !slices.Equal(aggregated, []string{into}) {
			t.Errorf("%s is aggregated into %v, want [%s]", role.Name, aggregated, into)
		}
		roles[strings.TrimPrefix(key, "ClusterRole/kubevisor.io:")] = role.Rules
	}
	kinds := []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancereplicasets",
		"virtualmachineinstancemigrations", "hypervisorclasses"}
	writes := []string{"create", "update", "patch", "delete", "deletecollection"}
	vmiSub := func(s string) string { return subresourcesv1alpha1.VirtualMachineInstances + "/" + s }
	vmSub := func(s string) string { return subresourcesv1alpha1.VirtualMachines + "/" + s }
	streams := []string{vmiSub(subresourcesv1alpha1.SubresourceConsole), vmiSub(subresourcesv1alpha1.SubresourceVNC), vmiSub(subresourcesv1alpha1.SubresourcePortForward)}
	actions := []string{vmiSub(subresourcesv1alpha1.SubresourcePause), vmiSub(subresourcesv1alpha1.SubresourceUnpause),
		vmiSub(subresourcesv1alpha1.SubresourceSoftReboot), vmiSub(subresourcesv1alpha1.SubresourceReset),
		vmSub(subresourcesv1alpha1.SubresourceStart), vmSub(subresourcesv1alpha1.SubresourceStop), vmSub(subresourcesv1alpha1.SubresourceRestart)}
	migrations := []string{vmSub(subresourcesv1alpha1.SubresourceMigrate), vmSub(subresourcesv1alpha1.SubresourceCancelMigration)}
	guest := vmiSub(subresourcesv1alpha1.SubresourceGuestOSInfo)
	const core, sub = "kubevisor.io", subresourcesv1alpha1.GroupName

	type check struct {
		group, resource, verb string
		want                  bool
	}
	var checks = map[string][]check{}
	add := func(role, group string, resources, verbs []string, want bool) {
		for _, res := range resources {
			for _, v := range verbs {
				checks[role] = append(checks[role], check{group, res, v, want})
			}
		}
	}
	for _, role := range []string{"view", "edit", "admin"} {
		add(role, core, kinds, []string{"get", "list", "watch"}, true)
		add(role, sub, []string{guest}, []string{"get"}, true)
		add(role, core, []string{"hypervisorclasses", "virtualmachineinstancemigrations"}, writes, false)
		add(role, sub, migrations, []string{"update"}, false)
	}
	add("view", core, kinds, writes, false)
	add("view", sub, streams, []string{"get"}, false)
	add("view", sub, actions, []string{"update"}, false)
	for _, role := range []string{"edit", "admin"} {
		add(role, core, kinds[:3], writes[:4], true)
		add(role, sub, streams, []string{"get"}, true)
		add(role, sub, actions, []string{"update"}, true)
	}
	add("edit", core, kinds[:3], []string{"deletecollection"}, false)
	add("admin", core, kinds[:3], []string{"deletecollection"}, true)
	add("migrate", core, kinds[3:4], []string{"get", "list", "watch", "create", "delete"}, true)
	add("migrate", sub, migrations, []string{"update"}, true)
	add("migrate", core, []string{"virtualmachines", "virtualmachineinstances", "hypervisorclasses"}, writes, false)
	add("migrate", sub, slices.Concat(streams, actions), []string{"get", "update"}, false)
	// MigrationPolicies are the cluster admin's: as KubeVirt's kubevirt.io:admin, admin reads
	// them and no user role writes them; view and edit do not see them.
	add("admin", core, []string{"migrationpolicies"}, []string{"get", "list", "watch"}, true)
	for _, role := range []string{"view", "edit", "admin", "migrate"} {
		add(role, core, []string{"migrationpolicies"}, writes, false)
	}
	add("view", core, []string{"migrationpolicies"}, []string{"get", "list"}, false)
	add("edit", core, []string{"migrationpolicies"}, []string{"get", "list"}, false)
	for role, cs := range checks {
		for _, c := range cs {
			if got := allows(roles[role], c.group, c.resource, c.verb, ""); got != c.want {
				t.Errorf("kubevisor.io:%s: %s %s.%s allowed %v, want %v", role, c.verb, c.resource, c.group, got, c.want)
			}
		}
	}
}
