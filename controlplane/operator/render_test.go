package operator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/manifests"
)

var testRenderer = Renderer{Manifests: manifests.FS, DefaultVersion: "v9"}

func specOf(drivers ...string) *v1alpha1.KubevisorSpec {
	s := &v1alpha1.KubevisorSpec{}
	for _, d := range drivers {
		s.Drivers = append(s.Drivers, v1alpha1.KubevisorDriver{Name: d})
	}
	return s
}

func mustRender(t *testing.T, spec *v1alpha1.KubevisorSpec) *Rendered {
	t.Helper()
	r, errs := testRenderer.Render(spec)
	if len(errs) > 0 {
		t.Fatalf("Render: %v", errs.ToAggregate())
	}
	return r
}

func find(r *Rendered, kind, name string) *unstructured.Unstructured {
	for _, o := range append(slices.Clone(r.CRDs), r.Objects...) {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func ids(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

// TestRenderMatchesInstallScript renders the default driver set and checks it against what
// hack/install.sh renders with kubectl's kustomize for the same set: the same objects, each
// with the same content but for the operator's label and version annotation, and
// kubevisor-api's --manage-ca=false (the operator owns the CA); and the operator's live
// configuration ConfigMap besides.
func TestRenderMatchesInstallScript(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatalf("kubectl is not on PATH (it renders the install script's manifests): %v", err)
	}
	drivers := []string{"qmp", "libvirt", "cni", "local", "hostdev"}
	out, err := exec.Command("../../hack/install.sh", "render", "--drivers", strings.Join(drivers, ","), "--tag", "v9").CombinedOutput()
	if err != nil {
		t.Fatalf("hack/install.sh render: %v\n%s", err, out)
	}
	var want []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			break
		}
		if m != nil {
			want = append(want, &unstructured.Unstructured{Object: m})
		}
	}
	got := mustRender(t, specOf(drivers...))
	// The live configuration is the operator's own: an install without it runs on flags.
	if find(got, "ConfigMap", liveconfig.Name) == nil {
		t.Errorf("no ConfigMap %s", liveconfig.Name)
	}
	all := slices.DeleteFunc(append(slices.Clone(got.CRDs), got.Objects...), func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "ConfigMap" && o.GetName() == liveconfig.Name
	})
	if g, w := ids(all), ids(want); !slices.Equal(g, w) {
		t.Fatalf("objects differ:\noperator: %v\nscript:   %v", g, w)
	}
	for _, w := range want {
		g := find(got, w.GetKind(), w.GetName())
		g = g.DeepCopy()
		labels := g.GetLabels()
		if labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("%s %s: label %s=%q, want %q", g.GetKind(), g.GetName(), ManagedByLabel, labels[ManagedByLabel], ManagedByValue)
		}
		delete(labels, ManagedByLabel)
		g.SetLabels(labels)
		unstructured.RemoveNestedField(g.Object, "spec", "template", "metadata", "annotations", VersionAnnotation)
		if a, ok, _ := unstructured.NestedMap(g.Object, "spec", "template", "metadata", "annotations"); ok && len(a) == 0 {
			unstructured.RemoveNestedField(g.Object, "spec", "template", "metadata", "annotations")
		}
		if g.GetKind() == "Deployment" && g.GetName() == APIDeployment {
			c := containerOf(t, g, "api")
			if !slices.Contains(c.Args, "--manage-ca=false") {
				t.Errorf("kubevisor-api args %q lack --manage-ca=false", c.Args)
			}
			containers, _, _ := unstructured.NestedSlice(g.Object, "spec", "template", "spec", "containers")
			args := containers[0].(map[string]any)["args"].([]any)
			containers[0].(map[string]any)["args"] = slices.DeleteFunc(args, func(a any) bool { return a == "--manage-ca=false" })
			_ = unstructured.SetNestedSlice(g.Object, containers, "spec", "template", "spec", "containers")
		}
		gj, _ := json.Marshal(g.Object)
		wj, _ := json.Marshal(w.Object)
		if !bytes.Equal(gj, wj) {
			t.Errorf("%s %s differs:\noperator: %s\nscript:   %s", g.GetKind(), g.GetName(), gj, wj)
		}
	}
	if got.Version != "v9" || got.DefaultClass != "qmp" || !slices.Equal(got.Classes, []string{"libvirt", "qmp"}) {
		t.Errorf("version %q, classes %v, default %q: want v9, [libvirt qmp], qmp", got.Version, got.Classes, got.DefaultClass)
	}
	// Workloads come after what they need, webhooks and classes after the workloads.
	rank := func(kind, name string) int {
		return slices.IndexFunc(got.Objects, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
	}
	if !(rank("ServiceAccount", "kubevisor-handler") < rank("DaemonSet", HandlerDaemonSet) &&
		rank("DaemonSet", HandlerDaemonSet) < rank("ValidatingWebhookConfiguration", "kubevisor-validating") &&
		rank("Deployment", APIDeployment) < rank("HypervisorClass", "qmp")) {
		t.Errorf("apply order: %v", ids(got.Objects))
	}
}

func TestRenderBadSpec(t *testing.T) {
	for _, c := range []struct {
		name string
		spec *v1alpha1.KubevisorSpec
		want string
	}{
		{"unknown driver", specOf("qmp", "cni", "local", "vmware"), `spec.drivers[3].name: Unsupported value: "vmware": supported values: "cni", "fake", "hostdev", "libvirt", "local", "qmp"`},
		{"no hypervisor", specOf("cni", "local"), "spec.drivers: Required value: no hypervisor driver"},
		{"no network", specOf("qmp", "local"), "spec.drivers: Invalid value: []: a node runs exactly one network driver (cni)"},
		{"no storage", specOf("qmp", "cni"), "exactly one storage driver"},
		{"twice", specOf("qmp", "cni", "local", "qmp"), `spec.drivers[3].name: Duplicate value: "qmp"`},
		{"default class not in the set", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Configuration.DefaultHypervisorClass = "libvirt"
			return s
		}(), `spec.configuration.defaultHypervisorClass: Unsupported value: "libvirt": supported values: "qmp"`},
		{"an image driver without its kind", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Drivers = append(s.Drivers, v1alpha1.KubevisorDriver{Name: "sim", Image: "example/sim:1"})
			return s
		}(), "spec.drivers[3]: Invalid value: \"example/sim:1 \": a driver from a driver image names its image and its kind"},
		{"an in-tree driver given a kind", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni")
			s.Drivers = append(s.Drivers, v1alpha1.KubevisorDriver{Name: "local", Image: "example/local:1", Kind: "storage"})
			return s
		}(), "spec.drivers[2].kind: Invalid value: \"storage\": an in-tree driver's kind is the release's: give only image to replace its binary"},
		{"two storage drivers", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Drivers = append(s.Drivers, v1alpha1.KubevisorDriver{Name: "hostpath", Image: "example/hostpath:1", Kind: "storage"})
			return s
		}(), "a node runs exactly one storage driver"},
		{"renewBefore over half the lifetime", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.CertificateRotateStrategy = &v1alpha1.CertificateRotateStrategy{SelfSigned: &v1alpha1.SelfSignedCertificates{
				CertDuration: &metav1.Duration{Duration: 24 * time.Hour}, RenewBefore: &metav1.Duration{Duration: 13 * time.Hour},
				CADuration: &metav1.Duration{Duration: 36 * time.Hour}}}
			return s
		}(), "spec.certificateRotateStrategy.selfSigned.renewBefore: Invalid value: \"13h0m0s\": more than 0 and at most half of certDuration (12h0m0s), spec.certificateRotateStrategy.selfSigned.caDuration: Invalid value: \"36h0m0s\": at least twice certDuration (48h0m0s)"},
		{"a migration timeout of 0", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Configuration.Migrations = &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{ProgressTimeout: ptr.To[int64](0)}}
			return s
		}(), "spec.configuration.migrations.progressTimeout: Invalid value: 0: at least 1 second"},
		{"a parallel limit of 0", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Configuration.Migrations = &v1alpha1.KubevisorMigrations{ParallelMigrationsPerCluster: ptr.To[int32](0)}
			return s
		}(), "spec.configuration.migrations.parallelMigrationsPerCluster: Invalid value: 0: at least 1"},
		{"a permitted host device's selector", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local", "hostdev")
			s.Drivers[3].Config = &apiextensionsv1.JSON{Raw: []byte(`{"permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"10de","resourceName":"gpu"},{"pciVendorSelector":"10de:1eb8","resourceName":"nvidia.com/T4"}]}}`)}
			return s
		}(), `spec.drivers[3].config.permittedHostDevices.pciHostDevices[0].pciVendorSelector: Invalid value: "10de": want vendor:device, four hex digits each ("10DE:1EB8"), spec.drivers[3].config.permittedHostDevices.pciHostDevices[1].resourceName: Invalid value: "nvidia.com/T4": the device plugins serve devices.kubevisor.io/<name> only`},
		{"KubeVirt's mediated devices", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local", "hostdev")
			s.Drivers[3].Config = &apiextensionsv1.JSON{Raw: []byte(`{"permittedHostDevices":{"mediatedDevices":[]}}`)}
			return s
		}(), `spec.drivers[3].config.permittedHostDevices: Invalid value: "{\"mediatedDevices\":[]}": unknown field "mediatedDevices"`},
		{"an unknown feature gate", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Configuration.FeatureGates = []string{"HostDisk", "LiveMigration", "Snapshot"}
			return s
		}(), `spec.configuration.featureGates[2]: Unsupported value: "Snapshot": supported values: "GPU", "HostDevices", "HostDisk", "LiveMigration", "NUMA"`},
		{"config not an object", func() *v1alpha1.KubevisorSpec {
			s := specOf("qmp", "cni", "local")
			s.Drivers[1].Config = &apiextensionsv1.JSON{Raw: []byte(`[1]`)}
			return s
		}(), "spec.drivers[1].config: Invalid value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, errs := testRenderer.Render(c.spec)
			if len(errs) == 0 {
				t.Fatalf("rendered %d objects, want an error", len(r.Objects))
			}
			if got := errs.ToAggregate().Error(); !strings.Contains(got, c.want) {
				t.Errorf("error %q, want it to hold %q", got, c.want)
			}
		})
	}
}

func handlerConfig(t *testing.T, r *Rendered) (name string, files map[string]string) {
	t.Helper()
	ds := find(r, "DaemonSet", HandlerDaemonSet)
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		if n, ok, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name"); ok && strings.HasPrefix(n, "kubevisor-handler") {
			name = n
		}
	}
	cm := find(r, "ConfigMap", name)
	if cm == nil {
		t.Fatalf("the DaemonSet mounts ConfigMap %q, which is not rendered", name)
	}
	files, _, _ = unstructured.NestedStringMap(cm.Object, "data")
	return name, files
}

// TestRenderDriverConfig: a driver's config is merged over the install's, in a handler
// configuration part of its own, and the new ConfigMap name rolls the DaemonSet.
func TestRenderDriverConfig(t *testing.T) {
	plain := mustRender(t, specOf("qmp", "cni", "local"))
	plainName, plainFiles := handlerConfig(t, plain)
	if _, ok := plainFiles[operatorHandlerFile]; ok {
		t.Errorf("without driver config the handler configuration has %s", operatorHandlerFile)
	}
	spec := specOf("qmp", "cni", "local")
	spec.Drivers[1].Config = &apiextensionsv1.JSON{Raw: []byte(`{"cniCacheDir":"/var/lib/elsewhere","mtu":1400}`)}
	r := mustRender(t, spec)
	name, files := handlerConfig(t, r)
	if name == plainName {
		t.Errorf("the handler's ConfigMap keeps its name %q with a new configuration: the DaemonSet would not roll", name)
	}
	var part struct {
		DriverConfig map[string]map[string]any `json:"driverConfig"`
	}
	if err := yaml.Unmarshal([]byte(files[operatorHandlerFile]), &part); err != nil {
		t.Fatalf("%s: %v\n%s", operatorHandlerFile, err, files[operatorHandlerFile])
	}
	cni := part.DriverConfig["cni"]
	if cni["cniCacheDir"] != "/var/lib/elsewhere" || cni["mtu"] != float64(1400) {
		t.Errorf("cni config %v: want the spec's cniCacheDir and mtu", cni)
	}
	if bin, _ := cni["cniBinDir"].([]any); len(bin) != 1 || bin[0] != "/opt/cni/bin" {
		t.Errorf("cni config %v: want the install's cniBinDir kept", cni)
	}
	for _, f := range []string{"00-base.yaml", "10-hypervisor-qmp.yaml", "10-network-cni.yaml", "10-storage-local.yaml"} {
		if _, ok := files[f]; !ok {
			t.Errorf("handler configuration lacks %s: %v", f, files)
		}
	}
}

func containerOf(t *testing.T, o *unstructured.Unstructured, name string) corev1.Container {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if c.(map[string]any)["name"] == name {
			var out corev1.Container
			data, _ := json.Marshal(c)
			if err := json.Unmarshal(data, &out); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
	t.Fatalf("%s %s has no container %s", o.GetKind(), o.GetName(), name)
	return corev1.Container{}
}

func TestRenderImagesAndFlags(t *testing.T) {
	spec := specOf("qmp", "cni", "local")
	spec.ImageRegistry = "registry.example:5000/kv"
	spec.ImageTag = "v2.1"
	spec.Configuration = v1alpha1.KubevisorConfiguration{
		DefaultEvictionStrategy: "LiveMigrate",
		Migrations: &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{
			BandwidthPerMigration:   ptr.To(resource.MustParse("64Mi")),
			CompletionTimeoutPerGiB: ptr.To[int64](300),
			ProgressTimeout:         ptr.To[int64](90),
			AllowPostCopy:           ptr.To(true),
		}},
		LogVerbosity: &v1alpha1.LogVerbosity{Controller: ptr.To[int32](4), API: ptr.To[int32](2), Handler: "debug"},
	}
	spec.CertificateRotateStrategy = &v1alpha1.CertificateRotateStrategy{SelfSigned: &v1alpha1.SelfSignedCertificates{
		CertDuration: &metav1.Duration{Duration: 24 * time.Hour}, RenewBefore: &metav1.Duration{Duration: 8 * time.Hour},
		CADuration: &metav1.Duration{Duration: 7 * 24 * time.Hour}, NodeCertMaxDuration: &metav1.Duration{Duration: time.Hour}}}
	r := mustRender(t, spec)
	if r.Version != "v2.1" {
		t.Errorf("version %q, want v2.1", r.Version)
	}
	ctl := containerOf(t, find(r, "Deployment", ControllerDeployment), "controller")
	api := containerOf(t, find(r, "Deployment", APIDeployment), "api")
	handler := containerOf(t, find(r, "DaemonSet", HandlerDaemonSet), "handler")
	for img, want := range map[string]string{ctl.Image: "controller", api.Image: "api", handler.Image: "handler"} {
		if img != "registry.example:5000/kv/kubevisor-"+want+":v2.1" {
			t.Errorf("image %q, want registry.example:5000/kv/kubevisor-%s:v2.1", img, want)
		}
	}
	launcher := ""
	for _, e := range ctl.Env {
		if e.Name == "KUBEVISOR_LAUNCHER_IMAGE" {
			launcher = e.Value
		}
	}
	if launcher != "registry.example:5000/kv/kubevisor-launcher:v2.1" {
		t.Errorf("launcher image %q, want registry.example:5000/kv/kubevisor-launcher:v2.1", launcher)
	}
	for _, want := range []string{"--default-eviction-strategy=LiveMigrate", "--leader-elect=true"} {
		if !slices.Contains(ctl.Args, want) {
			t.Errorf("controller args %q lack %s", ctl.Args, want)
		}
	}
	for _, want := range []string{"--default-eviction-strategy=LiveMigrate", "--cert-lifetime=24h0m0s", "--cert-renew-before=8h0m0s",
		"--node-cert-max-lifetime=1h0m0s", "--manage-ca=false"} {
		if !slices.Contains(api.Args, want) {
			t.Errorf("api args %q lack %s", api.Args, want)
		}
	}
	// The migration defaults and the verbosity are live: in the ConfigMap, not in the flags.
	for _, args := range [][]string{ctl.Args, api.Args} {
		if i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--migration-") || strings.HasPrefix(a, "--v=") }); i >= 0 {
			t.Errorf("args %q: %s is live, not a flag", args, args[i])
		}
	}
	live := liveConfig(t, r)
	if m := live.Migrations; m == nil || m.BandwidthPerMigration.String() != "64Mi" || *m.CompletionTimeoutPerGiB != 300 ||
		*m.ProgressTimeout != 90 || !*m.AllowPostCopy {
		t.Errorf("live migrations %+v, want the spec's", live.Migrations)
	}
	if v := live.LogVerbosity; v == nil || *v.Controller != 4 || *v.API != 2 || v.Handler != "debug" {
		t.Errorf("live verbosity %+v, want controller 4, api 2, handler debug", live.LogVerbosity)
	}
	// The CA is the operator's (caOptions), not kubevisor-api's.
	if slices.ContainsFunc(api.Args, func(a string) bool { return strings.HasPrefix(a, "--ca-lifetime") }) {
		t.Errorf("api args %q: the CA's lifetime is the operator's", api.Args)
	}
	if o := caOptions(spec); o.Lifetime != 24*time.Hour || o.RenewBefore != 8*time.Hour || o.CALifetime != 7*24*time.Hour {
		t.Errorf("CA options %+v, want the spec's lifetimes", o)
	}
	// The handler's log level is live too: its flag keeps the install's value.
	if slices.Contains(handler.Args, "--log-level=debug") || !slices.Contains(handler.Args, "--log-level=info") {
		t.Errorf("handler args %q: want the install's --log-level=info (debug is live)", handler.Args)
	}
	for _, o := range []*unstructured.Unstructured{find(r, "Deployment", ControllerDeployment), find(r, "DaemonSet", HandlerDaemonSet)} {
		if v, _, _ := unstructured.NestedString(o.Object, "spec", "template", "metadata", "annotations", VersionAnnotation); v != "v2.1" {
			t.Errorf("%s: template annotation %s=%q, want v2.1", o.GetName(), VersionAnnotation, v)
		}
	}
}

// liveConfig is the live configuration r renders, parsed as the components parse it.
func liveConfig(t *testing.T, r *Rendered) liveconfig.Config {
	t.Helper()
	cm := find(r, "ConfigMap", liveconfig.Name)
	if cm == nil || cm.GetNamespace() != liveconfig.Namespace || cm.GetLabels()[ManagedByLabel] != ManagedByValue {
		t.Fatalf("live configuration ConfigMap %v: want %s/%s with the operator's label", cm, liveconfig.Namespace, liveconfig.Name)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	c, err := liveconfig.Parse(data)
	if err != nil {
		t.Fatalf("the rendered live configuration does not parse: %v\n%v", err, data)
	}
	return c
}

// TestRenderLiveFieldsKeepTemplates: a change of only live fields (migration defaults and
// limits, the components' verbosity, hostdev's permitted host devices) changes the live
// configuration ConfigMap and no workload, so nothing restarts; a spec without them renders a
// ConfigMap without them (the flags, and the nodes' driverConfig.hostdev, apply again). The
// rest of a driver's configuration is not live: it changes the DaemonSet.
func TestRenderLiveFieldsKeepTemplates(t *testing.T) {
	a, b := specOf("qmp", "cni", "local"), specOf("qmp", "cni", "local")
	a.Configuration.Migrations = &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{
		ProgressTimeout: ptr.To[int64](90)}, ParallelMigrationsPerCluster: ptr.To[int32](2)}
	a.Configuration.LogVerbosity = &v1alpha1.LogVerbosity{Controller: ptr.To[int32](4)}
	b.Configuration.Migrations = &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{
		ProgressTimeout: ptr.To[int64](300), AllowAutoConverge: ptr.To(true)}, ParallelOutboundMigrationsPerNode: ptr.To[int32](1)}
	b.Configuration.LogVerbosity = &v1alpha1.LogVerbosity{API: ptr.To[int32](6), Handler: "trace"}
	a.Configuration.FeatureGates = []string{"HostDisk", "LiveMigration"}
	b.Configuration.FeatureGates = []string{"HostDevices"}
	ra, rb, rn := mustRender(t, a), mustRender(t, b), mustRender(t, specOf("qmp", "cni", "local"))
	for _, w := range []struct{ kind, name string }{{"Deployment", ControllerDeployment}, {"Deployment", APIDeployment}, {"DaemonSet", HandlerDaemonSet}} {
		ja, _ := json.Marshal(find(ra, w.kind, w.name).Object)
		jb, _ := json.Marshal(find(rb, w.kind, w.name).Object)
		jn, _ := json.Marshal(find(rn, w.kind, w.name).Object)
		if !bytes.Equal(ja, jb) || !bytes.Equal(ja, jn) {
			t.Errorf("%s %s differs between specs that differ only in live fields:\n%s\n%s", w.kind, w.name, ja, jb)
		}
	}
	ca, cb, cn := liveConfig(t, ra), liveConfig(t, rb), liveConfig(t, rn)
	if *ca.Migrations.ProgressTimeout != 90 || *ca.Migrations.ParallelMigrationsPerCluster != 2 || *liveconfig.ControllerVerbosity(ca) != 4 {
		t.Errorf("live configuration of a: %+v", ca)
	}
	if *cb.Migrations.ProgressTimeout != 300 || cb.Migrations.ParallelMigrationsPerCluster != nil || *liveconfig.APIVerbosity(cb) != 6 ||
		liveconfig.ControllerVerbosity(cb) != nil || cb.LogVerbosity.Handler != "trace" {
		t.Errorf("live configuration of b: %+v", cb)
	}
	if cn.Migrations != nil || cn.LogVerbosity != nil {
		t.Errorf("live configuration without live fields: %+v, want none (the flags)", cn)
	}
	// The feature gates are always written, [] when the spec lists none: the Kubevisor, not
	// kubevisor-api's --feature-gates, says which gates are on.
	if !slices.Equal(ca.FeatureGates, []string{"HostDisk", "LiveMigration"}) || !slices.Equal(cb.FeatureGates, []string{"HostDevices"}) {
		t.Errorf("live feature gates %q and %q, want the specs'", ca.FeatureGates, cb.FeatureGates)
	}
	if cn.FeatureGates == nil || len(cn.FeatureGates) != 0 {
		t.Errorf("live feature gates of a spec without them: %#v, want [] (none enabled, not the flag's)", cn.FeatureGates)
	}

	// hostdev's permitted host devices: live, in the ConfigMap, not the handler configuration.
	hostdev := func(config string) *Rendered {
		h := specOf("qmp", "cni", "local", "hostdev")
		if config != "" {
			h.Drivers[3].Config = &apiextensionsv1.JSON{Raw: []byte(config)}
		}
		return mustRender(t, h)
	}
	daemonSet := func(r *Rendered) []byte {
		j, _ := json.Marshal(find(r, "DaemonSet", HandlerDaemonSet).Object)
		return j
	}
	gpu := `"permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"10DE:1EB8","resourceName":"gpu-t4"}]}`
	hn, hg := hostdev(""), hostdev("{"+gpu+"}")
	hnic := hostdev(`{"permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"8086:1572","resourceName":"nic"}]}}`)
	if !bytes.Equal(daemonSet(hn), daemonSet(hg)) || !bytes.Equal(daemonSet(hg), daemonSet(hnic)) {
		t.Errorf("hostdev's permitted host devices changed the DaemonSet: they are live\n%s\n%s", daemonSet(hn), daemonSet(hg))
	}
	_, files := handlerConfig(t, hg)
	for name, f := range files {
		var part driverPart
		if err := yaml.Unmarshal([]byte(f), &part); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if strings.Contains(string(part.DriverConfig["hostdev"]), "permittedHostDevices") {
			t.Errorf("handler configuration %s holds the permitted host devices: %s", name, part.DriverConfig["hostdev"])
		}
	}
	if p := liveConfig(t, hg).PermittedHostDevices; p == nil || len(p.PCIHostDevices) != 1 || p.PCIHostDevices[0] != (v1alpha1.PCIHostDevice{PCIVendorSelector: "10DE:1EB8", ResourceName: "gpu-t4"}) {
		t.Errorf("live permitted host devices %+v, want the spec's gpu-t4", p)
	}
	if p := liveConfig(t, hn).PermittedHostDevices; p != nil {
		t.Errorf("live permitted host devices without any in the spec: %+v, want none (the nodes' own)", p)
	}
	// An empty list is live too (none permitted), and null is the nodes' own.
	if p := liveConfig(t, hostdev(`{"permittedHostDevices":{}}`)).PermittedHostDevices; p == nil || len(p.PCIHostDevices) != 0 {
		t.Errorf("permittedHostDevices {}: live %+v, want an empty one", p)
	}
	if p := liveConfig(t, hostdev(`{"permittedHostDevices":null}`)).PermittedHostDevices; p != nil {
		t.Errorf("permittedHostDevices null: live %+v, want none", p)
	}
	// The rest of hostdev's configuration still rolls the handlers, the permitted host
	// devices beside it still do not.
	hp, hpg := hostdev(`{"pollInterval":"5s"}`), hostdev(`{"pollInterval":"5s",`+gpu+`}`)
	if bytes.Equal(daemonSet(hn), daemonSet(hp)) {
		t.Error("hostdev's pollInterval left the DaemonSet as it was: it is not live, and must roll the handlers")
	}
	if !bytes.Equal(daemonSet(hp), daemonSet(hpg)) {
		t.Error("permitted host devices beside pollInterval changed the DaemonSet")
	}
}

func TestRenderDefaultClass(t *testing.T) {
	if r := mustRender(t, specOf("libvirt", "cni", "local")); r.DefaultClass != "libvirt" ||
		find(r, "HypervisorClass", "libvirt").GetAnnotations()[DefaultClassAnnotation] != "true" {
		t.Errorf("libvirt alone: default %q, want libvirt, annotated", r.DefaultClass)
	}
	spec := specOf("qmp", "libvirt", "cni", "local")
	spec.Configuration.DefaultHypervisorClass = "libvirt"
	r := mustRender(t, spec)
	if r.DefaultClass != "libvirt" || find(r, "HypervisorClass", "libvirt").GetAnnotations()[DefaultClassAnnotation] != "true" {
		t.Errorf("default libvirt: %q, want libvirt, annotated", r.DefaultClass)
	}
	if _, ok := find(r, "HypervisorClass", "qmp").GetAnnotations()[DefaultClassAnnotation]; ok {
		t.Errorf("default libvirt: the qmp class keeps the default annotation")
	}
}

func TestRenderPlacement(t *testing.T) {
	spec := specOf("qmp", "cni", "local")
	spec.Infra = &v1alpha1.ComponentPlacement{
		NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""},
		Tolerations:  []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Replicas:     ptr.To[int32](2),
	}
	spec.Workloads = &v1alpha1.ComponentPlacement{NodeSelector: map[string]string{"kubevisor.io/vms": "true"}}
	r := mustRender(t, spec)
	for _, name := range []string{ControllerDeployment, APIDeployment} {
		if n, _, _ := unstructured.NestedInt64(find(r, "Deployment", name).Object, "spec", "replicas"); n != 2 {
			t.Errorf("%s replicas %d, want infra's 2", name, n)
		}
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(find(r, "DaemonSet", HandlerDaemonSet).Object, "spec", "replicas"); found {
		t.Errorf("the handler DaemonSet got replicas")
	}
	if n, _, _ := unstructured.NestedInt64(find(mustRender(t, specOf("qmp", "cni", "local")), "Deployment", ControllerDeployment).Object, "spec", "replicas"); n != 1 {
		t.Errorf("controller replicas without infra: %d, want the install's 1", n)
	}
	var ctl, ds struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	data, _ := json.Marshal(find(r, "Deployment", ControllerDeployment).Object)
	_ = json.Unmarshal(data, &ctl)
	data, _ = json.Marshal(find(r, "DaemonSet", HandlerDaemonSet).Object)
	_ = json.Unmarshal(data, &ds)
	if _, ok := ctl.Spec.Template.Spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("controller node selector %v lacks the infra one", ctl.Spec.Template.Spec.NodeSelector)
	}
	if !slices.ContainsFunc(ctl.Spec.Template.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "node-role.kubernetes.io/control-plane" }) {
		t.Errorf("controller tolerations %v lack the infra one", ctl.Spec.Template.Spec.Tolerations)
	}
	if ds.Spec.Template.Spec.NodeSelector["kubevisor.io/vms"] != "true" {
		t.Errorf("handler node selector %v: want the workloads'", ds.Spec.Template.Spec.NodeSelector)
	}
	if len(ds.Spec.Template.Spec.Tolerations) != 2 {
		t.Errorf("handler tolerations %v: want the install's two kept", ds.Spec.Template.Spec.Tolerations)
	}
}

// TestRenderDriverImages: drivers from driver images get an init container each (after the
// base's plugin-dir), a handler configuration part naming them by kind, and a hypervisor a
// class of its name.
func TestRenderDriverImages(t *testing.T) {
	spec := specOf("qmp", "cni", "hostdev")
	spec.Drivers = append(spec.Drivers,
		v1alpha1.KubevisorDriver{Name: "sim", Image: "kubevisor-examples/sim-device:dev", Kind: "device"},
		v1alpha1.KubevisorDriver{Name: "hostpath", Image: "kubevisor-examples/hostpath-storage:dev", Kind: "storage",
			Config: &apiextensionsv1.JSON{Raw: []byte(`{"root":"/var/lib/disks"}`)}},
		v1alpha1.KubevisorDriver{Name: "vbox", Image: "example/vbox:1", Kind: "hypervisor"})
	r := mustRender(t, spec)
	ds := find(r, "DaemonSet", HandlerDaemonSet)
	inits, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "initContainers")
	var names []string
	for _, c := range inits {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	if want := []string{"install-seccomp", "plugin-dir", "driver-sim", "driver-hostpath", "driver-vbox"}; !slices.Equal(names, want) {
		t.Errorf("init containers %v, want %v", names, want)
	}
	if img := inits[2].(map[string]any)["image"]; img != "kubevisor-examples/sim-device:dev" {
		t.Errorf("driver-sim image %v", img)
	}
	_, files := handlerConfig(t, r)
	var part struct {
		Drivers map[string]any `json:"drivers"`
	}
	if err := yaml.Unmarshal([]byte(files[imageDriversHandlerFile]), &part); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(part.Drivers) != "map[devices:[sim] hypervisors:[vbox] storage:hostpath]" {
		t.Errorf("%s: drivers %v", imageDriversHandlerFile, part.Drivers)
	}
	if !strings.Contains(files[operatorHandlerFile], "root: /var/lib/disks") {
		t.Errorf("%s lacks hostpath's config:\n%s", operatorHandlerFile, files[operatorHandlerFile])
	}
	if c := find(r, "HypervisorClass", "vbox"); c == nil || c.Object["driver"] != "vbox" || c.GetLabels()[ManagedByLabel] != ManagedByValue {
		t.Errorf("class vbox %v: want one naming its driver, with the operator's label", c)
	}
	if !slices.Equal(r.Drivers, []string{"cni", "hostdev", "hostpath", "qmp", "sim", "vbox"}) {
		t.Errorf("drivers %v", r.Drivers)
	}
}

// TestRenderInTreeDriverImage: an image on an in-tree driver (no kind) replaces that driver's
// binary through an init container; the driver set, its class and configuration stay the
// release's.
func TestRenderInTreeDriverImage(t *testing.T) {
	plain := mustRender(t, specOf("qmp", "cni", "local"))
	spec := specOf("qmp", "cni", "local")
	spec.Drivers[0].Image = "kubevisor/kubevisor-driver-qmp:v2"
	r := mustRender(t, spec)
	inits, _, _ := unstructured.NestedSlice(find(r, "DaemonSet", HandlerDaemonSet).Object, "spec", "template", "spec", "initContainers")
	last := inits[len(inits)-1].(map[string]any)
	if last["name"] != "driver-qmp" || last["image"] != "kubevisor/kubevisor-driver-qmp:v2" {
		t.Errorf("last init container %v, want driver-qmp from the image", last)
	}
	if !slices.Equal(r.Drivers, plain.Drivers) || !slices.Equal(r.Classes, plain.Classes) {
		t.Errorf("drivers %v classes %v, want %v %v as without the image", r.Drivers, r.Classes, plain.Drivers, plain.Classes)
	}
	_, files := handlerConfig(t, r)
	_, plainFiles := handlerConfig(t, plain)
	if !maps.Equal(files, plainFiles) {
		t.Errorf("the handler configuration changed with the driver's image:\n%v\nwant\n%v", files, plainFiles)
	}
}
