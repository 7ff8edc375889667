package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName names the operator's controller (logs, metrics).
const ControllerName = "kubevisor-operator"

// Finalizer keeps a Kubevisor until its install is uninstalled per its uninstallStrategy.
const Finalizer = v1alpha1.LabelPrefix + "operator"

// How soon a reconcile looks again at what it waits for that no watch reports: CRDs to be
// established and objects to go (waitShort); VMIs to be deleted, rollouts (Recheck).
const (
	waitShort      = 2 * time.Second
	DefaultRecheck = 15 * time.Second
)

// Reconciler reconciles the Kubevisor object: it renders the install its spec wants, applies
// it, rolls the workloads out in order, prunes what the spec no longer wants, and reports.
type Reconciler struct {
	// Client writes, and reads the Kubevisors and the workloads of kubevisor-system from the
	// manager's cache.
	Client client.Client
	// Reader reads uncached: the VMIs of every namespace, the objects to prune.
	Reader   client.Reader
	Renderer Renderer
	// Recheck is how soon the operator looks again at what it waits for; 0 is DefaultRecheck.
	Recheck time.Duration
}

func (r *Reconciler) recheck() time.Duration {
	if r.Recheck > 0 {
		return r.Recheck
	}
	return DefaultRecheck
}

// +kubebuilder:rbac:groups=kubevisor.io,resources=kubevisors,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=kubevisors/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=kubevisors/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,namespace=kubevisor-system,resources=deployments;daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=serviceaccounts;configmaps;services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=kubevisor-system,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=kube-system,resources=rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=kube-system,resources=roles,verbs=list
// +kubebuilder:rbac:groups="",namespace=kube-system,resources=serviceaccounts;configmaps;services,verbs=list
// +kubebuilder:rbac:groups=apps,namespace=kube-system,resources=deployments;daemonsets,verbs=list
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// The roles the install makes hold rights the operator does not: it may grant (escalate) and
// bind those roles by name, and only those (server-side apply names the object, so the API
// server checks these names on create too).
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=kubevisor-api;kubevisor-controller;kubevisor-handler;kubevisor.io:admin;kubevisor.io:edit;kubevisor.io:migrate;kubevisor.io:view,verbs=escalate;bind
// The scrapers' role (get /metrics) is made, and bound by nobody here.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=kubevisor-metrics-reader,verbs=escalate
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=system:auth-delegator,verbs=bind
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=kubevisor-system,resources=roles,resourceNames=kubevisor-api;kubevisor-controller;kubevisor-handler,verbs=escalate;bind
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=kube-system,resources=roles,resourceNames=extension-apiserver-authentication-reader,verbs=bind
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=kubevisor.io,resources=hypervisorclasses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines;virtualmachineinstances;virtualmachineinstancereplicasets;virtualmachineinstancemigrations,verbs=list;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the operator's controller: it watches the Kubevisors, and the
// workloads and pods of kubevisor-system, whose changes it reports in the active Kubevisor's
// status.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toActive := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list v1alpha1.KubevisorList
		if err := r.Client.List(ctx, &list); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, kv := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&kv)})
		}
		return out
	})
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == Namespace })
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.Kubevisor{}).
		Watches(&appsv1.Deployment{}, toActive, builder.WithPredicates(inNamespace)).
		Watches(&appsv1.DaemonSet{}, toActive, builder.WithPredicates(inNamespace)).
		Watches(&corev1.Pod{}, toActive, builder.WithPredicates(inNamespace)).
		Complete(r)
}

func (r *Reconciler) log(ctx context.Context) logr.Logger {
	return ctrl.LoggerFrom(ctx).WithName(ControllerName)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var kv v1alpha1.Kubevisor
	if err := r.Client.Get(ctx, req.NamespacedName, &kv); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	orig := kv.DeepCopy()
	res, err := r.reconcile(ctx, &kv)
	kv.Status.ObservedGeneration = kv.Generation
	if !equality.Semantic.DeepEqual(orig.Status, kv.Status) {
		// A merge patch of the status alone: the operator is its only writer.
		if perr := r.Client.Status().Patch(ctx, &kv, client.MergeFrom(orig)); perr != nil && !apierrors.IsNotFound(perr) {
			err = errors.Join(err, perr)
		}
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, kv *v1alpha1.Kubevisor) (reconcile.Result, error) {
	active, err := r.active(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if active != nil && active.Name != kv.Name {
		msg := fmt.Sprintf("Kubevisor %q is the cluster's install: this one is not acted on; delete it", active.Name)
		setCondition(kv, v1alpha1.KubevisorAvailable, false, ReasonAnotherKubevisor, msg)
		setCondition(kv, v1alpha1.KubevisorProgressing, false, ReasonAnotherKubevisor, msg)
		setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonAnotherKubevisor, msg)
		if kv.DeletionTimestamp != nil && controllerutil.RemoveFinalizer(kv, Finalizer) {
			return reconcile.Result{}, r.Client.Update(ctx, kv)
		}
		return reconcile.Result{}, nil
	}
	if kv.DeletionTimestamp != nil {
		return r.uninstall(ctx, kv)
	}
	if controllerutil.AddFinalizer(kv, Finalizer) {
		status := kv.Status.DeepCopy()
		if err := r.Client.Update(ctx, kv); err != nil {
			return reconcile.Result{}, err
		}
		kv.Status = *status
	}

	rendered, errs := r.Renderer.Render(&kv.Spec)
	if len(errs) > 0 {
		// The running install is kept as it is.
		r.observe(ctx, kv, kv.Status.ObservedVersion)
		setCondition(kv, v1alpha1.KubevisorProgressing, false, ReasonInvalidSpec, "the spec is not applied")
		setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonInvalidSpec, errs.ToAggregate().Error())
		return reconcile.Result{}, nil
	}
	kv.Status.TargetVersion = rendered.Version

	stale, err := r.stale(ctx, append(slices.Clone(rendered.CRDs), rendered.Objects...))
	if err != nil {
		return reconcile.Result{}, err
	}
	if inUse, err := r.droppedClassesInUse(ctx, stale); err != nil {
		return reconcile.Result{}, err
	} else if inUse != "" {
		r.observe(ctx, kv, kv.Status.ObservedVersion)
		setCondition(kv, v1alpha1.KubevisorProgressing, false, ReasonDriverInUse, "the spec is not applied")
		setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonDriverInUse, inUse)
		return reconcile.Result{RequeueAfter: r.recheck()}, nil
	}

	if done, err := r.applyCRDs(ctx, rendered.CRDs); err != nil || !done {
		return r.applyTrouble(kv, err)
	}
	caRecheck, err := r.ensureCA(ctx, &kv.Spec)
	if err != nil {
		return r.applyTrouble(kv, err)
	}
	var workloads []*unstructured.Unstructured
	for _, o := range rendered.Objects {
		switch {
		case o.GetKind() == "Namespace" && o.GetName() == Namespace:
			// The operator runs in it: it is there, and not the install's to change.
		case o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet":
			workloads = append(workloads, o)
		default:
			if _, err := r.apply(ctx, o); err != nil {
				return r.applyTrouble(kv, err)
			}
		}
	}
	rolledOut, err := r.rollOut(ctx, workloads, rendered.Version)
	if err != nil {
		return r.applyTrouble(kv, err)
	}
	lines := r.observe(ctx, kv, rendered.Version)
	if !rolledOut {
		waiting := notReady(lines, rendered.Version)
		setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonRollingOut, "rolling out "+rendered.Version+": "+waiting)
		if troubled(lines) {
			setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonComponentNotReady, waiting)
		} else {
			setCondition(kv, v1alpha1.KubevisorDegraded, false, ReasonAsExpected, "")
		}
		return reconcile.Result{RequeueAfter: r.recheck()}, nil
	}
	// Everything runs at the target: what the spec no longer wants goes.
	if err := r.remove(ctx, stale); err != nil {
		return r.applyTrouble(kv, err)
	}
	kv.Status.ObservedVersion = rendered.Version
	kv.Status.Drivers = rendered.Drivers
	setCondition(kv, v1alpha1.KubevisorAvailable, true, ReasonInstalled,
		fmt.Sprintf("Kubevisor %s is installed with drivers %s", rendered.Version, strings.Join(rendered.Drivers, ", ")))
	setCondition(kv, v1alpha1.KubevisorProgressing, false, ReasonInstalled, "")
	setCondition(kv, v1alpha1.KubevisorDegraded, false, ReasonAsExpected, "")
	return reconcile.Result{RequeueAfter: caRecheck}, nil
}

// troubled reports whether a line says something beyond waiting: a pod that cannot pull its
// image, crash-loops or cannot be scheduled.
func troubled(lines []v1alpha1.KubevisorComponentStatus) bool {
	return slices.ContainsFunc(lines, func(l v1alpha1.KubevisorComponentStatus) bool { return strings.Contains(l.Message, "; pod ") })
}

// applyTrouble reports an apply that failed (or CRDs not yet established, err nil) and asks to
// be called again.
func (r *Reconciler) applyTrouble(kv *v1alpha1.Kubevisor, err error) (reconcile.Result, error) {
	if err == nil {
		setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonApplying, "waiting for the CRDs to be established")
		return reconcile.Result{RequeueAfter: waitShort}, nil
	}
	setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonApplying, "applying the install")
	setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonApplyFailed, err.Error())
	return reconcile.Result{}, err
}

// active returns the Kubevisor the operator acts on: the oldest (then first by name).
func (r *Reconciler) active(ctx context.Context) (*v1alpha1.Kubevisor, error) {
	var list v1alpha1.KubevisorList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.Kubevisor) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return &list.Items[0], nil
}

// applyCRDs applies the CRDs and reports whether all are established.
func (r *Reconciler) applyCRDs(ctx context.Context, crds []*unstructured.Unstructured) (bool, error) {
	for _, o := range crds {
		if _, err := r.apply(ctx, o); err != nil {
			return false, err
		}
	}
	for _, o := range crds {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			return false, fmt.Errorf("get CustomResourceDefinition %s: %w", o.GetName(), err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		established := slices.ContainsFunc(conds, func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Established" && m["status"] == "True"
		})
		if !established {
			return false, nil
		}
	}
	return true, nil
}

// workloadOrder is the rollout order of the workloads (by name); others come last.
var workloadOrder = []string{ControllerDeployment, HandlerDaemonSet, APIDeployment}

// rollOut applies the workloads in workloadOrder. A workload that already runs another
// template is updated only once those before it run at version: on an upgrade the controller
// goes first, the node handlers next, the API last, so that the API keeps answering the
// components still at the old version, and an image that cannot be pulled stops the rollout
// at the first component (whose old pods keep running). A workload that does not exist yet is
// created at once. It reports whether all run at version.
func (r *Reconciler) rollOut(ctx context.Context, workloads []*unstructured.Unstructured, version string) (bool, error) {
	slices.SortStableFunc(workloads, func(a, b *unstructured.Unstructured) int {
		return orderOf(a.GetName()) - orderOf(b.GetName())
	})
	blocked, all := false, true
	for _, w := range workloads {
		exists := true
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(w.GroupVersionKind())
		if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(w), cur); apierrors.IsNotFound(err) {
			exists = false
		} else if err != nil {
			return false, fmt.Errorf("get %s %s: %w", w.GetKind(), objName(w), err)
		}
		if blocked && exists {
			all = false
			continue
		}
		applied, err := r.apply(ctx, w)
		if err != nil {
			return false, err
		}
		// The stored object, not the cache's: its generation is the one just applied.
		line, err := r.lineOf(ctx, applied)
		if err != nil {
			return false, err
		}
		if !lineReady(line, version) {
			blocked, all = true, false
		}
	}
	return all, nil
}

func orderOf(name string) int {
	if i := slices.Index(workloadOrder, name); i >= 0 {
		return i
	}
	return len(workloadOrder)
}

// lineOf is the status line of a workload, from the object the API server returned.
func (r *Reconciler) lineOf(ctx context.Context, u *unstructured.Unstructured) (v1alpha1.KubevisorComponentStatus, error) {
	switch u.GetKind() {
	case "Deployment":
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
			return v1alpha1.KubevisorComponentStatus{}, err
		}
		pods, err := r.pods(ctx, d.Spec.Selector)
		return deploymentLine(&d, pods), err
	case "DaemonSet":
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ds); err != nil {
			return v1alpha1.KubevisorComponentStatus{}, err
		}
		pods, err := r.pods(ctx, ds.Spec.Selector)
		return daemonSetLine(&ds, pods), err
	}
	return v1alpha1.KubevisorComponentStatus{}, fmt.Errorf("%s %s is not a workload", u.GetKind(), objName(u))
}

// line reads the status line of a workload of kubevisor-system from the cache; nil when it
// does not exist.
func (r *Reconciler) line(ctx context.Context, kind, name string) (*v1alpha1.KubevisorComponentStatus, error) {
	key := client.ObjectKey{Namespace: Namespace, Name: name}
	var obj client.Object
	switch kind {
	case "Deployment":
		obj = &appsv1.Deployment{}
	case "DaemonSet":
		obj = &appsv1.DaemonSet{}
	default:
		return nil, fmt.Errorf("%s %s is not a workload", kind, name)
	}
	if err := r.Client.Get(ctx, key, obj); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetKind(kind)
	l, err := r.lineOf(ctx, u)
	return &l, err
}

func (r *Reconciler) pods(ctx context.Context, sel *metav1.LabelSelector) ([]corev1.Pod, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil, err
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(Namespace), client.MatchingLabelsSelector{Selector: s}); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// observe writes the workloads' lines into kv's status, and Available: every workload ready at
// version (the spec's target, or the last installed one while the spec is refused).
func (r *Reconciler) observe(ctx context.Context, kv *v1alpha1.Kubevisor, version string) []v1alpha1.KubevisorComponentStatus {
	var lines []v1alpha1.KubevisorComponentStatus
	for _, w := range []struct{ kind, name string }{
		{"Deployment", ControllerDeployment}, {"DaemonSet", HandlerDaemonSet}, {"Deployment", APIDeployment},
	} {
		l, err := r.line(ctx, w.kind, w.name)
		switch {
		case err != nil:
			lines = append(lines, v1alpha1.KubevisorComponentStatus{Name: w.name, Kind: w.kind, Message: err.Error()})
		case l == nil:
			lines = append(lines, v1alpha1.KubevisorComponentStatus{Name: w.name, Kind: w.kind, Message: "not installed"})
		default:
			lines = append(lines, *l)
		}
	}
	kv.Status.Components = lines
	ready := version != ""
	for _, l := range lines {
		ready = ready && lineReady(l, version)
	}
	switch {
	case ready:
		setCondition(kv, v1alpha1.KubevisorAvailable, true, ReasonInstalled, "every component runs "+version)
	case version == "":
		setCondition(kv, v1alpha1.KubevisorAvailable, false, ReasonNoInstall, "nothing installed yet")
	default:
		// Available stays true during an upgrade while the workloads serve (old pods or new).
		serving := true
		for _, l := range lines {
			serving = serving && l.Ready > 0
		}
		if serving && meta.IsStatusConditionTrue(kv.Status.Conditions, v1alpha1.KubevisorAvailable) {
			return lines
		}
		setCondition(kv, v1alpha1.KubevisorAvailable, false, ReasonRollingOut, notReady(lines, version))
	}
	return lines
}

// droppedClassesInUse says which HypervisorClasses the spec drops (stale) while VMIs use them,
// or "": their node handlers would no longer load the driver of those running VMs.
func (r *Reconciler) droppedClassesInUse(ctx context.Context, stale []unstructured.Unstructured) (string, error) {
	var dropped []string
	for _, o := range stale {
		if o.GetKind() == "HypervisorClass" {
			dropped = append(dropped, o.GetName())
		}
	}
	if len(dropped) == 0 {
		return "", nil
	}
	var vmis v1alpha1.VirtualMachineInstanceList
	if err := r.Reader.List(ctx, &vmis); err != nil {
		return "", fmt.Errorf("list VMIs: %w", err)
	}
	var msgs []string
	for _, c := range dropped {
		var users []string
		for _, v := range vmis.Items {
			if v.Spec.HypervisorClassName == c || v.Status.HypervisorClassName == c {
				users = append(users, v.Namespace+"/"+v.Name)
			}
		}
		if len(users) > 0 {
			msgs = append(msgs, fmt.Sprintf("the spec drops HypervisorClass %s (its driver), which VMIs use: %s", c, strings.Join(firstN(users, 5), ", ")))
		}
	}
	if len(msgs) == 0 {
		return "", nil
	}
	return strings.Join(msgs, "; ") + "; nothing applied: stop those VMs (or delete the VMIs) first, or keep the driver", nil
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}
