package deviceplugins

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// reconfigureInProcess is Reconfigurer for an in-process driver: it configures the client
// again, as plugin.Host.Reconfigure does a plugin's.
type reconfigureInProcess struct{ src Source }

func (r reconfigureInProcess) Reconfigure(ctx context.Context, _ string, config json.RawMessage) error {
	return r.src.Device.Configure(ctx, &basev1.ConfigureRequest{Config: config})
}

// TestLiveHostDevicesAsTheHandlerServiceAccount runs what kubevisor-deviceplugins runs for the
// live configuration (the watcher, liveconfig.HostDevices, HostDevices.Set) against a real API
// server, as the service account of the handler DaemonSet's pod, the deviceplugins container's,
// with only the install's RoleBinding and the generated handler Role in kubevisor-system: it
// reads the ConfigMap, the plugins follow its permitted host devices, and its deletion brings
// back the node's.
func TestLiveHostDevicesAsTheHandlerServiceAccount(t *testing.T) {
	sa := handlerServiceAccount(t)
	env := envtest.Start(t, envtest.Options{})
	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: liveconfig.Namespace}}); err != nil {
		t.Fatal(err)
	}
	role := manifestObject[rbacv1.Role](t, "manifests/rbac/handler/role.yaml", "Role", liveconfig.Namespace, "kubevisor-handler")
	binding := manifestObject[rbacv1.RoleBinding](t, "manifests/install/rbac.yaml", "RoleBinding", liveconfig.Namespace, "kubevisor-handler")
	if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name || !slices.ContainsFunc(binding.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == liveconfig.Namespace
	}) {
		t.Fatalf("RoleBinding %+v does not bind Role %s to the service account %s", binding, role.Name, sa)
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	c := liveconfig.New()
	c.PermittedHostDevices = &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "8086:1572", ResourceName: "nic"}}}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: liveconfig.Namespace, Name: liveconfig.Name}, Data: data}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}

	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + liveconfig.Namespace + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + liveconfig.Namespace, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := hostdevtest.New(t)
	base := h.Config(t, "1h", 1, "10de:1eb8=gpu")
	src := hostdevSource(t, base)
	mgr, err := NewManager(ctx, testConfig(pluginDir(t), time.Hour), []Source{src}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	hd := &HostDevices{Host: reconfigureInProcess{src}, Base: base, Manager: mgr}
	log := funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{})
	w := &liveconfig.Watcher{Client: cs, Log: log, Appliers: []liveconfig.Applier{liveconfig.HostDevices(ctx, hd.Set, log)}}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Start(wctx) }()
	defer func() { cancel(); <-done }()

	wantPCI := func(what, res string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := resources(mgr)
			if slices.Contains(got, v1alpha1.DeviceResourcePrefix+res) && len(got) == 5 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: plugins %v, want the character devices and %s", what, got, res)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wantPCI("the ConfigMap's devices, read as the handler's service account", "nic")
	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	wantPCI("the ConfigMap deleted: the node's", "gpu")
}

// handlerServiceAccount is the service account of the handler DaemonSet's pod, which has the
// deviceplugins container and does not turn off its token.
func handlerServiceAccount(t *testing.T) string {
	t.Helper()
	ds := manifestObject[appsv1.DaemonSet](t, "manifests/install/handler.yaml", "DaemonSet", "", "kubevisor-handler")
	pod := ds.Spec.Template.Spec
	if !slices.ContainsFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "deviceplugins" }) {
		t.Fatalf("the handler DaemonSet has no deviceplugins container")
	}
	if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
		t.Fatalf("the handler pod turns its service account token off: the deviceplugins container cannot read the live configuration")
	}
	if pod.ServiceAccountName == "" {
		t.Fatalf("the handler pod names no service account")
	}
	return pod.ServiceAccountName
}

// manifestObject is the object of kind and name (and namespace, when not empty) in a
// manifest file of the repository.
func manifestObject[T any](t *testing.T, file, kind, namespace, name string) *T {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		md, _ := obj["metadata"].(map[string]any)
		if obj["kind"] != kind || md["name"] != name || (namespace != "" && md["namespace"] != namespace) {
			continue
		}
		out := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	t.Fatalf("%s: no %s %s/%s", file, kind, namespace, name)
	return nil
}
