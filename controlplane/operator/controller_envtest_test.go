package operator_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/controlplane/operator"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

const timeout = 60 * time.Second

// harness is an API server with kubevisor-operator running against it as a user granted
// exactly its +kubebuilder:rbac markers. No kube-controller-manager or kubelet runs: player
// plays the deployment and daemon set controllers, writing the status of every workload of
// kubevisor-system as rolled out unless the test holds it back.
type harness struct {
	t   *testing.T
	ctx context.Context
	c   client.Client

	mu   sync.Mutex
	hold map[string]bool // workloads the player leaves un-rolled
}

func start(t *testing.T) *harness {
	ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 0}))
	env := envtest.Start(t, envtest.Options{})
	h := &harness{t: t, ctx: context.Background(), c: env.Client, hold: map[string]bool{}}
	// The operator's CRD comes with the operator, and the operator runs in kubevisor-system.
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "operator", "crd", "kubevisor.io_kubevisors.yaml"))
	h.must(err)
	var crd unstructured.Unstructured
	h.must(yaml.Unmarshal(data, &crd.Object))
	h.must(h.c.Create(h.ctx, &crd))
	h.eventually("the Kubevisor CRD is served", func() (bool, error) {
		err := h.c.List(h.ctx, &v1alpha1.KubevisorList{})
		return err == nil, nil
	})
	h.must(h.c.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operator.Namespace}}))

	cfg := env.ImpersonateWithMarkers(t, "kubevisor-operator-test", "controller.go", "ca.go")
	mgr, err := operator.NewManager(cfg, operator.Config{Version: "v1", MetricsAddr: "0", HealthProbeAddr: "0", Recheck: 500 * time.Millisecond})
	h.must(err)
	envtest.RunManager(t, mgr)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.play(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func (h *harness) must(err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) eventually(what string, cond func() (bool, error)) {
	h.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(h.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		h.t.Fatalf("%s: not within %s (last error: %v)", what, timeout, last)
	}
}

func (h *harness) holdBack(names ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hold = map[string]bool{}
	for _, n := range names {
		h.hold[n] = true
	}
}

func (h *harness) held(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hold[name]
}

// play writes every workload of kubevisor-system rolled out at its latest generation with one
// pod (one node), as the deployment and daemon set controllers would, unless held back.
func (h *harness) play(ctx context.Context) {
	for ctx.Err() == nil {
		var ds appsv1.DaemonSetList
		var ds2 appsv1.DeploymentList
		if h.c.List(ctx, &ds, client.InNamespace(operator.Namespace)) == nil {
			for _, d := range ds.Items {
				if h.held(d.Name) || d.Status.ObservedGeneration == d.Generation {
					continue
				}
				d.Status = appsv1.DaemonSetStatus{ObservedGeneration: d.Generation, DesiredNumberScheduled: 1, CurrentNumberScheduled: 1,
					UpdatedNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
				_ = h.c.Status().Update(ctx, &d)
			}
		}
		if h.c.List(ctx, &ds2, client.InNamespace(operator.Namespace)) == nil {
			for _, d := range ds2.Items {
				if h.held(d.Name) || d.Status.ObservedGeneration == d.Generation {
					continue
				}
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
				_ = h.c.Status().Update(ctx, &d)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (h *harness) kv(name string) *v1alpha1.Kubevisor {
	h.t.Helper()
	var kv v1alpha1.Kubevisor
	h.must(h.c.Get(h.ctx, client.ObjectKey{Name: name}, &kv))
	return &kv
}

// waitCondition waits until the named Kubevisor's condition has status and reason, at its
// latest generation, and returns the Kubevisor.
func (h *harness) waitCondition(name, typ string, status metav1.ConditionStatus, reason string) *v1alpha1.Kubevisor {
	h.t.Helper()
	var kv v1alpha1.Kubevisor
	h.eventually(fmt.Sprintf("Kubevisor %s %s=%s (%s)", name, typ, status, reason), func() (bool, error) {
		if err := h.c.Get(h.ctx, client.ObjectKey{Name: name}, &kv); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(kv.Status.Conditions, typ)
		if c == nil {
			return false, fmt.Errorf("no %s condition: %+v", typ, kv.Status.Conditions)
		}
		if c.Status != status || c.Reason != reason || kv.Status.ObservedGeneration != kv.Generation {
			return false, fmt.Errorf("%s=%s (%s): %s", typ, c.Status, c.Reason, c.Message)
		}
		return true, nil
	})
	return &kv
}

func condition(kv *v1alpha1.Kubevisor, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(kv.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func (h *harness) image(kind, name, container string) string {
	h.t.Helper()
	var spec corev1.PodSpec
	switch kind {
	case "Deployment":
		var d appsv1.Deployment
		h.must(h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: name}, &d))
		spec = d.Spec.Template.Spec
	default:
		var d appsv1.DaemonSet
		h.must(h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: name}, &d))
		spec = d.Spec.Template.Spec
	}
	for _, c := range spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	h.t.Fatalf("%s %s has no container %s", kind, name, container)
	return ""
}

func (h *harness) classes() []string {
	h.t.Helper()
	var list v1alpha1.HypervisorClassList
	h.must(h.c.List(h.ctx, &list))
	var out []string
	for _, c := range list.Items {
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out
}

// managed lists what carries the operator's label, as "Kind namespace/name".
func (h *harness) managed() []string {
	h.t.Helper()
	var out []string
	for _, gvk := range []struct{ g, v, k string }{
		{"apiextensions.k8s.io", "v1", "CustomResourceDefinition"}, {"rbac.authorization.k8s.io", "v1", "ClusterRole"},
		{"rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"}, {"admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration"},
		{"apiregistration.k8s.io", "v1", "APIService"}, {"", "v1", "ConfigMap"}, {"apps", "v1", "Deployment"},
		{"apps", "v1", "DaemonSet"}, {"", "v1", "ServiceAccount"}, {"rbac.authorization.k8s.io", "v1", "RoleBinding"},
	} {
		var list unstructured.UnstructuredList
		list.SetAPIVersion(strings.TrimPrefix(gvk.g+"/"+gvk.v, "/"))
		list.SetKind(gvk.k + "List")
		if err := h.c.List(h.ctx, &list, client.MatchingLabels{operator.ManagedByLabel: operator.ManagedByValue}); err != nil {
			h.t.Fatalf("list %s: %v", gvk.k, err)
		}
		for _, o := range list.Items {
			out = append(out, gvk.k+" "+o.GetNamespace()+"/"+o.GetName())
		}
	}
	return out
}

func drivers(names ...string) []v1alpha1.KubevisorDriver {
	var out []v1alpha1.KubevisorDriver
	for _, n := range names {
		out = append(out, v1alpha1.KubevisorDriver{Name: n})
	}
	return out
}

// TestOperatorLifecycle installs from a Kubevisor object, and then, on the same API server:
// a second Kubevisor refused, a bad spec and a dropped driver in use refused with the install
// kept, the driver dropped once unused (its class pruned), an upgrade rolled out in order and
// stopped at an image that cannot be pulled, configuration reaching the flags, and the
// uninstall blocked while a VMI exists, then removing it and everything the operator made.
func TestOperatorLifecycle(t *testing.T) {
	h := start(t)
	// Before any webhook exists (nothing serves them here): two VMIs (vm-qmp marked outdated
	// as the workload updater does), a node with the labels a handler publishes and one of the
	// admin's.
	for _, class := range []string{"libvirt", "qmp"} {
		vmi := &v1alpha1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: "vm-" + class, Namespace: "default"},
			Spec:       v1alpha1.VirtualMachineInstanceSpec{HypervisorClassName: class},
		}
		if class == "qmp" {
			vmi.Labels = map[string]string{v1alpha1.OutdatedLauncherImageLabel: ""}
		}
		h.must(h.c.Create(h.ctx, vmi))
	}
	h.must(h.c.Create(h.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		v1alpha1.SchedulableNodeLabel: "true", v1alpha1.DriverHealthLabel("hypervisor", "qmp"): "healthy", "kubevisor.io/vms": "true",
	}}}))

	t.Log("install")
	h.holdBack(operator.APIDeployment)
	kv := &v1alpha1.Kubevisor{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevisor"},
		Spec:       v1alpha1.KubevisorSpec{Drivers: drivers("qmp", "libvirt", "cni", "local", "hostdev")},
	}
	h.must(h.c.Create(h.ctx, kv))
	got := h.waitCondition("kubevisor", v1alpha1.KubevisorProgressing, metav1.ConditionTrue, operator.ReasonRollingOut)
	if c := condition(got, v1alpha1.KubevisorAvailable); c.Status != metav1.ConditionFalse {
		t.Errorf("Available while kubevisor-api is not ready: %+v", c)
	}
	if got.Status.TargetVersion != "v1" || !strings.Contains(condition(got, v1alpha1.KubevisorProgressing).Message, "deployment kubevisor-api") {
		t.Errorf("target %q, Progressing %q: want v1, naming kubevisor-api", got.Status.TargetVersion, condition(got, v1alpha1.KubevisorProgressing).Message)
	}
	h.holdBack()
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorAvailable, metav1.ConditionTrue, operator.ReasonInstalled)
	if got.Status.ObservedVersion != "v1" || !slices.Equal(got.Status.Drivers, []string{"cni", "hostdev", "libvirt", "local", "qmp"}) || len(got.Status.Components) != 3 {
		t.Errorf("status %+v: want version v1, the five drivers, three components", got.Status)
	}
	for _, l := range got.Status.Components {
		if l.Ready != 1 || l.Version != "v1" || l.Message != "" {
			t.Errorf("component %+v: want ready at v1", l)
		}
	}
	if !slices.Contains(got.Finalizers, operator.Finalizer) {
		t.Errorf("finalizers %v lack %s", got.Finalizers, operator.Finalizer)
	}
	// vm-qmp, which the workload updater marked outdated, is counted in the status.
	h.eventually("one outdated VMI in the status", func() (bool, error) {
		n := h.kv("kubevisor").Status.OutdatedVirtualMachineInstanceWorkloads
		return n != nil && *n == 1, nil
	})
	if c := h.classes(); !slices.Equal(c, []string{"libvirt", "qmp"}) {
		t.Errorf("classes %v, want libvirt and qmp", c)
	}
	if img := h.image("Deployment", operator.ControllerDeployment, "controller"); img != "kubevisor/kubevisor-controller:v1" {
		t.Errorf("controller image %q, want the operator's version v1", img)
	}
	// The operator owns the CA: its Secret holds a CA and the bundle.
	var caSecret corev1.Secret
	h.must(h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: certs.DefaultCASecret}, &caSecret))
	if caSecret.Type != corev1.SecretTypeTLS || len(caSecret.Data[corev1.TLSPrivateKeyKey]) == 0 || !bytes.Contains(caSecret.Data[certs.BundleKey], caSecret.Data[corev1.TLSCertKey]) {
		t.Errorf("CA secret of type %q with keys %v: want a CA and a bundle holding it", caSecret.Type, slices.Sorted(maps.Keys(caSecret.Data)))
	}
	installed := h.managed()
	for _, want := range []string{"CustomResourceDefinition /virtualmachineinstances.kubevisor.io", "DaemonSet kubevisor-system/kubevisor-handler",
		"APIService /v1alpha1.subresources.kubevisor.io", "RoleBinding kube-system/kubevisor-api:extension-apiserver-authentication-reader"} {
		if !slices.Contains(installed, want) {
			t.Errorf("installed %v lacks %s", installed, want)
		}
	}

	t.Log("a second Kubevisor")
	h.must(h.c.Create(h.ctx, &v1alpha1.Kubevisor{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Spec: v1alpha1.KubevisorSpec{Drivers: drivers("qmp")}}))
	second := h.waitCondition("second", v1alpha1.KubevisorDegraded, metav1.ConditionTrue, operator.ReasonAnotherKubevisor)
	if !strings.Contains(condition(second, v1alpha1.KubevisorDegraded).Message, `"kubevisor"`) {
		t.Errorf("second's Degraded %q does not name the active one", condition(second, v1alpha1.KubevisorDegraded).Message)
	}
	h.must(h.c.Delete(h.ctx, second))
	h.eventually("the second Kubevisor is gone", func() (bool, error) {
		err := h.c.Get(h.ctx, client.ObjectKey{Name: "second"}, &v1alpha1.Kubevisor{})
		return apierrors.IsNotFound(err), err
	})

	t.Log("a bad spec")
	envtest.Update(t, h.c, h.kv("kubevisor"), func(kv *v1alpha1.Kubevisor) {
		kv.Spec.Drivers = append(kv.Spec.Drivers, v1alpha1.KubevisorDriver{Name: "vmware"})
	})
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorDegraded, metav1.ConditionTrue, operator.ReasonInvalidSpec)
	if msg := condition(got, v1alpha1.KubevisorDegraded).Message; !strings.Contains(msg, `spec.drivers[5].name: Unsupported value: "vmware"`) {
		t.Errorf("Degraded %q does not name the field", msg)
	}
	if c := condition(got, v1alpha1.KubevisorAvailable); c.Status != metav1.ConditionTrue {
		t.Errorf("the running install is no longer Available after a refused spec: %+v", c)
	}

	t.Log("a driver dropped while a VMI uses its class")
	envtest.Update(t, h.c, h.kv("kubevisor"), func(kv *v1alpha1.Kubevisor) { kv.Spec.Drivers = drivers("qmp", "cni", "local", "hostdev") })
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorDegraded, metav1.ConditionTrue, operator.ReasonDriverInUse)
	if msg := condition(got, v1alpha1.KubevisorDegraded).Message; !strings.Contains(msg, "HypervisorClass libvirt") || !strings.Contains(msg, "default/vm-libvirt") {
		t.Errorf("Degraded %q: want the class and the VMI named", msg)
	}
	if c := h.classes(); !slices.Contains(c, "libvirt") {
		t.Errorf("classes %v: the libvirt class went while a VMI uses it", c)
	}
	h.must(h.c.Delete(h.ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-libvirt", Namespace: "default"}}))
	h.waitCondition("kubevisor", v1alpha1.KubevisorDegraded, metav1.ConditionFalse, operator.ReasonAsExpected)
	h.waitCondition("kubevisor", v1alpha1.KubevisorAvailable, metav1.ConditionTrue, operator.ReasonInstalled)
	h.eventually("the libvirt class is pruned", func() (bool, error) { return slices.Equal(h.classes(), []string{"qmp"}), nil })
	var cms corev1.ConfigMapList
	h.must(h.c.List(h.ctx, &cms, client.InNamespace(operator.Namespace)))
	var cmNames []string
	for _, cm := range cms.Items {
		if cm.Name != liveconfig.Name {
			cmNames = append(cmNames, cm.Name)
		}
	}
	if len(cmNames) != 1 || len(cms.Items) != 2 {
		t.Errorf("ConfigMaps %v in kubevisor-system besides %s (%d in all), want the handler's current one only (the old one pruned)", cmNames, liveconfig.Name, len(cms.Items))
	}

	t.Log("upgrade to v2, the controller's new pods not coming up")
	h.holdBack(operator.ControllerDeployment)
	envtest.Update(t, h.c, h.kv("kubevisor"), func(kv *v1alpha1.Kubevisor) { kv.Spec.ImageTag = "v2" })
	h.eventually("the controller runs the v2 image", func() (bool, error) {
		return h.image("Deployment", operator.ControllerDeployment, "controller") == "kubevisor/kubevisor-controller:v2", nil
	})
	// The kubelet's word on the new pod: its image cannot be pulled.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevisor-controller-new", Namespace: operator.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "kubevisor-controller"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "kubevisor/kubevisor-controller:v2"}}},
	}
	h.must(h.c.Create(h.ctx, pod))
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "controller", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "ErrImageNeverPull", Message: `Container image "kubevisor/kubevisor-controller:v2" is not present with pull policy of Never`}}}}
	h.must(h.c.Status().Update(h.ctx, pod))
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorDegraded, metav1.ConditionTrue, operator.ReasonComponentNotReady)
	if msg := condition(got, v1alpha1.KubevisorDegraded).Message; !strings.Contains(msg, "deployment kubevisor-controller") || !strings.Contains(msg, "ErrImageNeverPull") {
		t.Errorf("Degraded %q: want the controller and the image error named", msg)
	}
	if c := condition(got, v1alpha1.KubevisorAvailable); c.Status != metav1.ConditionTrue {
		t.Errorf("Available %+v during the upgrade while the old pods serve", c)
	}
	// The rollout stops at the controller: the handlers and the API keep v1.
	time.Sleep(time.Second)
	if img := h.image("DaemonSet", operator.HandlerDaemonSet, "handler"); img != "kubevisor/kubevisor-handler:v1" {
		t.Errorf("handler image %q while the controller is not rolled out: want v1", img)
	}
	if img := h.image("Deployment", operator.APIDeployment, "api"); img != "kubevisor/kubevisor-api:v1" {
		t.Errorf("api image %q while the controller is not rolled out: want v1", img)
	}
	h.must(h.c.Delete(h.ctx, pod))
	t.Log("the controller comes up: the handlers, then the API")
	h.holdBack(operator.HandlerDaemonSet)
	h.eventually("the handlers run the v2 image", func() (bool, error) {
		return h.image("DaemonSet", operator.HandlerDaemonSet, "handler") == "kubevisor/kubevisor-handler:v2", nil
	})
	if img := h.image("Deployment", operator.APIDeployment, "api"); img != "kubevisor/kubevisor-api:v1" {
		t.Errorf("api image %q while the handlers are not rolled out: want v1", img)
	}
	h.holdBack()
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorProgressing, metav1.ConditionFalse, operator.ReasonInstalled)
	if c := condition(got, v1alpha1.KubevisorAvailable); c.Status != metav1.ConditionTrue || got.Status.ObservedVersion != "v2" || h.image("Deployment", operator.APIDeployment, "api") != "kubevisor/kubevisor-api:v2" {
		t.Errorf("observed version %q, api %q: want v2", got.Status.ObservedVersion, h.image("Deployment", operator.APIDeployment, "api"))
	}

	t.Log("configuration: a live field reaches the live ConfigMap and leaves the workloads as they are")
	generations := map[string]int64{}
	for _, name := range []string{operator.ControllerDeployment, operator.APIDeployment} {
		var d appsv1.Deployment
		h.must(h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: name}, &d))
		generations[name] = d.Generation
	}
	envtest.Update(t, h.c, h.kv("kubevisor"), func(kv *v1alpha1.Kubevisor) {
		kv.Spec.Configuration.Migrations = &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{CompletionTimeoutPerGiB: ptr.To[int64](300)}}
	})
	h.eventually("the live configuration gets the migration default", func() (bool, error) {
		var cm corev1.ConfigMap
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: liveconfig.Namespace, Name: liveconfig.Name}, &cm); err != nil {
			return false, err
		}
		c, err := liveconfig.Parse(cm.Data)
		return err == nil && c.Migrations != nil && ptr.Deref(c.Migrations.CompletionTimeoutPerGiB, 0) == 300, err
	})
	h.waitCondition("kubevisor", v1alpha1.KubevisorAvailable, metav1.ConditionTrue, operator.ReasonInstalled)
	for name, gen := range generations {
		var d appsv1.Deployment
		h.must(h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: name}, &d))
		if d.Generation != gen {
			t.Errorf("Deployment %s: generation %d, was %d: a live field changed it (its pods roll)", name, d.Generation, gen)
		}
	}

	t.Log("uninstall, blocked while a VMI exists")
	before := h.managed()
	h.must(h.c.Delete(h.ctx, h.kv("kubevisor")))
	got = h.waitCondition("kubevisor", v1alpha1.KubevisorDegraded, metav1.ConditionTrue, operator.ReasonUninstallBlocked)
	if msg := condition(got, v1alpha1.KubevisorDegraded).Message; !strings.Contains(msg, "VirtualMachineInstance default/vm-qmp") {
		t.Errorf("Degraded %q does not name the VMI", msg)
	}
	if after := h.managed(); !slices.Equal(after, before) {
		t.Errorf("the install changed while the uninstall is blocked: %v, before %v", after, before)
	}
	t.Log("uninstallStrategy RemoveWorkloads")
	envtest.Update(t, h.c, h.kv("kubevisor"), func(kv *v1alpha1.Kubevisor) { kv.Spec.UninstallStrategy = v1alpha1.UninstallRemoveWorkloads })
	h.eventually("the Kubevisor is gone", func() (bool, error) {
		err := h.c.Get(h.ctx, client.ObjectKey{Name: "kubevisor"}, &v1alpha1.Kubevisor{})
		return apierrors.IsNotFound(err), err
	})
	if left := h.managed(); len(left) > 0 {
		t.Errorf("left after the uninstall: %v", left)
	}
	if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: operator.Namespace, Name: certs.DefaultCASecret}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the CA secret after the uninstall: %v, want it gone", err)
	}
	var node corev1.Node
	h.must(h.c.Get(h.ctx, client.ObjectKey{Name: "node-a"}, &node))
	if _, ok := node.Labels[v1alpha1.SchedulableNodeLabel]; ok || node.Labels["kubevisor.io/vms"] != "true" {
		t.Errorf("node labels %v: want the handlers' removed, the admin's kept", node.Labels)
	}
}
