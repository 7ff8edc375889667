package workloadupdate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName names the controller (metrics, logs, events' reporting controller).
const ControllerName = "workload-update"

// Reasons of the workload updater's events, on the VMI.
const (
	// ReasonOutdatedLauncher says the VMI was marked: its launcher pod runs an older image.
	ReasonOutdatedLauncher = "OutdatedLauncherImage"
	// ReasonLauncherUpdated says the mark was removed: the VMI runs the current image (or ended).
	ReasonLauncherUpdated = "LauncherImageUpdated"
	// ReasonMigrationCreated says a migration was created to move the VMI to the current image.
	ReasonMigrationCreated = "WorkloadUpdateMigrationCreated"
	// ReasonEvicted says the VMI's launcher pod was evicted.
	ReasonEvicted = "WorkloadUpdateEvicted"
	// ReasonFailed says a migration could not be created or an eviction was refused.
	ReasonFailed = "WorkloadUpdateFailed"
)

// MigrationGenerateName starts the names of the workload updater's migrations, which also
// carry v1alpha1.WorkloadUpdateLabel.
const MigrationGenerateName = "kubevisor-workload-update-"

// key is the one request of the controller: it decides over every VMI at once.
var key = reconcile.Request{NamespacedName: types.NamespacedName{Name: "workload-update"}}

// Options configure the workload updater.
type Options struct {
	// LauncherImage is the current launcher image (required).
	LauncherImage string
	// Settings is the strategy; the zero value marks only, with the default batch.
	Settings Settings
	// SkipNameValidation lets several managers in one process register the controller (tests).
	SkipNameValidation bool
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// HandlerDaemonSet is the node handlers' DaemonSet: while its rollout is under way (some
	// node runs an older handler, or none), no batch acts (Observation.Held). Zero: no hold
	// (an install whose handlers are not a DaemonSet of the cluster).
	HandlerDaemonSet types.NamespacedName
}

type reconciler struct {
	client    client.Client
	apiReader client.Reader // the handler DaemonSet, read by name (no cache of DaemonSets)
	recorder  recorder.EventRecorder
	opts      Options
	lastBatch time.Time // only the one reconcile of key writes it (one worker)
}

// SetupWithManager registers the workload updater with mgr: any change of a VMI, a launcher
// pod or a migration brings one decision over all VMIs.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if opts.LauncherImage == "" {
		return errors.New("workload updater: no launcher image")
	}
	if err := opts.Settings.Validate(); err != nil {
		return err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder(ControllerName), opts: opts}
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	copts := controller.Options{MaxConcurrentReconciles: 1}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = &opts.SkipNameValidation
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		Watches(&v1alpha1.VirtualMachineInstance{}, toKey).
		Watches(&corev1.Pod{}, toKey).
		Watches(&v1alpha1.VirtualMachineInstanceMigration{}, toKey).
		WithOptions(copts).
		Complete(r)
}

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apps,namespace=kubevisor-system,resources=daemonsets,verbs=get

// The DaemonSet right names no resource: kustomize renames a resourceNames entry equal to a
// generated ConfigMap's name (the handler's configuration is the ConfigMap kubevisor-handler),
// whatever the rule's resource, which would grant get on a DaemonSet that does not exist.

// Reconcile observes every VMI, decides (Decide) and acts. A failed action is reported and
// the others go on.
func (r *reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	obs, err := r.observe(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(obs)
	err = r.act(ctx, d, obs.Now)
	if d.Outdated > 0 {
		ctrl.LoggerFrom(ctx).V(1).Info("outdated VMIs", "outdated", d.Outdated, "batch", len(d.Batch), "left", d.Left, "next", d.Wait, "held", d.Held)
	}
	return ctrl.Result{RequeueAfter: d.Wait}, err
}

func (r *reconciler) observe(ctx context.Context) (Observation, error) {
	obs := Observation{LauncherImage: r.opts.LauncherImage, Settings: r.opts.Settings, LastBatch: r.lastBatch, Now: r.opts.Now()}
	if ds := r.opts.HandlerDaemonSet; ds.Name != "" {
		held, err := r.handlersHeld(ctx, ds)
		if err != nil {
			return obs, err
		}
		obs.Held = held
	}
	// Every VMI and migration of the cache at each decision: they are read, never written
	// (label patches go to a fresh object), so the cache's objects are not copied.
	var vmis v1alpha1.VirtualMachineInstanceList
	if err := r.client.List(ctx, &vmis, client.UnsafeDisableDeepCopy); err != nil {
		return obs, fmt.Errorf("list VMIs: %w", err)
	}
	var migs v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.client.List(ctx, &migs, client.UnsafeDisableDeepCopy); err != nil {
		return obs, fmt.Errorf("list migrations: %w", err)
	}
	byVMI := map[types.NamespacedName][]v1alpha1.VirtualMachineInstanceMigration{}
	for _, m := range migs.Items {
		k := types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}
		byVMI[k] = append(byVMI[k], m)
	}
	for i := range vmis.Items {
		vmi := &vmis.Items[i]
		w := Workload{VMI: vmi, Migrations: byVMI[client.ObjectKeyFromObject(vmi)]}
		if name := vmi.Status.LauncherPodName; name != "" && vmi.Status.Phase == v1alpha1.Running {
			pod := &corev1.Pod{}
			switch err := r.client.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: name}, pod); {
			case apierrors.IsNotFound(err):
			case err != nil:
				return obs, fmt.Errorf("get launcher pod %s/%s: %w", vmi.Namespace, name, err)
			default:
				w.Pod = pod
			}
		}
		obs.Workloads = append(obs.Workloads, w)
	}
	return obs, nil
}

// handlersHeld reads the handler DaemonSet and says why its rollout holds the updater ("":
// every scheduled handler pod is of its current template and available). A DaemonSet that does
// not exist holds it too: no node would serve a migration's target or a VM started again.
func (r *reconciler) handlersHeld(ctx context.Context, key types.NamespacedName) (string, error) {
	ds := &appsv1.DaemonSet{}
	switch err := r.apiReader.Get(ctx, key, ds); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("handler daemonset %s does not exist", key), nil
	case err != nil:
		return "", fmt.Errorf("get handler daemonset %s: %w", key, err)
	}
	return RolloutPending(ds), nil
}

// RolloutPending says why DaemonSet ds has not finished rolling out ("" when it has): its
// controller has not seen its latest generation, or some scheduled node runs a pod of an older
// template or none available.
func RolloutPending(ds *appsv1.DaemonSet) string {
	st := ds.Status
	switch {
	case st.ObservedGeneration < ds.Generation:
		return fmt.Sprintf("daemonset %s/%s: generation %d not observed yet", ds.Namespace, ds.Name, ds.Generation)
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		return fmt.Sprintf("daemonset %s/%s rolling out: %d of %d nodes updated", ds.Namespace, ds.Name, st.UpdatedNumberScheduled, st.DesiredNumberScheduled)
	case st.NumberAvailable < st.DesiredNumberScheduled:
		return fmt.Sprintf("daemonset %s/%s: %d of %d pods available", ds.Namespace, ds.Name, st.NumberAvailable, st.DesiredNumberScheduled)
	}
	return ""
}

func (r *reconciler) act(ctx context.Context, d Decision, now time.Time) error {
	var errs []error
	for _, vmi := range d.Mark {
		if err := r.label(ctx, vmi, true); err != nil {
			errs = append(errs, err)
			continue
		}
		r.recorder.Eventf(vmi, nil, corev1.EventTypeNormal, ReasonOutdatedLauncher, "Mark",
			"launcher pod %s runs another image than %s: marked %s", vmi.Status.LauncherPodName, r.opts.LauncherImage, v1alpha1.OutdatedLauncherImageLabel)
	}
	for _, vmi := range d.Unmark {
		if err := r.label(ctx, vmi, false); err != nil {
			errs = append(errs, err)
			continue
		}
		r.recorder.Eventf(vmi, nil, corev1.EventTypeNormal, ReasonLauncherUpdated, "Unmark",
			"the VMI no longer runs an outdated launcher image: removed %s", v1alpha1.OutdatedLauncherImageLabel)
	}
	if len(d.Batch) > 0 {
		r.lastBatch = now
	}
	for _, a := range d.Batch {
		switch a.Method {
		case v1alpha1.WorkloadUpdateMethodLiveMigrate:
			r.migrate(ctx, a.VMI)
		case v1alpha1.WorkloadUpdateMethodEvict:
			r.evict(ctx, a.VMI, a.Pod)
		}
	}
	return errors.Join(errs...)
}

// label adds (or removes) OutdatedLauncherImageLabel on vmi by a merge patch of that key alone.
func (r *reconciler) label(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, set bool) error {
	var value any // null removes the key
	if set {
		value = ""
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{v1alpha1.OutdatedLauncherImageLabel: value}}})
	if err != nil {
		return err
	}
	// A fresh object: Patch writes the answer into it, and vmi is the cache's own.
	target := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: vmi.Name, Namespace: vmi.Namespace}}
	if err := r.client.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("label VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

// migrate creates a migration of vmi; a failure is reported on the VMI and in the log, and
// retried at a later batch.
func (r *reconciler) migrate(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) {
	m := NewMigration(vmi)
	if err := r.client.Create(ctx, m); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "create workload update migration", "vmi", client.ObjectKeyFromObject(vmi))
		r.recorder.Eventf(vmi, nil, corev1.EventTypeWarning, ReasonFailed, "CreateMigration",
			"create a migration to the current launcher image %s: %v", r.opts.LauncherImage, err)
		return
	}
	r.recorder.Eventf(vmi, m, corev1.EventTypeNormal, ReasonMigrationCreated, "CreateMigration",
		"created migration %s to move the VMI to the current launcher image %s", m.Name, r.opts.LauncherImage)
}

// evict evicts vmi's launcher pod through the Eviction API, so that PodDisruptionBudgets and
// kubevisor-api's eviction webhook (the VMI's eviction strategy) apply; a refusal is reported
// on the VMI and in the log, and tried again at a later batch.
func (r *reconciler) evict(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}
	if err := r.client.SubResource("eviction").Create(ctx, pod, ev); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "evict outdated launcher pod", "vmi", client.ObjectKeyFromObject(vmi), "pod", pod.Name)
		r.recorder.Eventf(vmi, pod, corev1.EventTypeWarning, ReasonFailed, "Evict",
			"eviction of launcher pod %s (outdated launcher image) refused: %v", pod.Name, err)
		return
	}
	r.recorder.Eventf(vmi, pod, corev1.EventTypeNormal, ReasonEvicted, "Evict",
		"evicted launcher pod %s: it runs an outdated launcher image (current %s)", pod.Name, r.opts.LauncherImage)
}

// NewMigration builds the workload updater's migration of vmi: generateName
// MigrationGenerateName, labelled v1alpha1.WorkloadUpdateLabel.
func NewMigration(vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstanceMigration {
	return &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: MigrationGenerateName,
			Namespace:    vmi.Namespace,
			Labels:       map[string]string{v1alpha1.WorkloadUpdateLabel: "true"},
		},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
}
