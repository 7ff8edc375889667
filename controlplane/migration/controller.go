// Package migration runs the VirtualMachineInstanceMigration lifecycle up to a target launcher
// pod ready on another node; the node side moves the guest and reports the outcome on the VMI.
package migration

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName names the controller (metrics, logs, events' reporting controller).
const ControllerName = "migration"

// Finalizer keeps a migration until its target pod is gone and the VMI no longer carries its
// unfinished migration state.
const Finalizer = v1alpha1.LabelPrefix + "migration"

// Field indexes on migrations, for mapping VMI and pod events back to the migrations.
const (
	indexVMIName = "spec.vmiName"
	indexUID     = "metadata.uid"
)

// Options configure the migration controller.
type Options struct {
	// MaxConcurrentReconciles is how many migrations are reconciled at once (default 1).
	MaxConcurrentReconciles int
	// SkipNameValidation allows a second controller named "migration" in one process (tests).
	SkipNameValidation bool
	// Settings are the cluster's migration settings, over which the MigrationPolicy that selects
	// a VMI applies (Resolve), read at each reconcile (they may change while the controller
	// runs); nil means DefaultSettings().
	Settings *SettingsValue
	// LauncherImage is the current launcher image, which target pods run (TargetPod); "" keeps
	// the source pod's.
	LauncherImage string
}

// Reconciler reconciles VirtualMachineInstanceMigrations.
type Reconciler struct {
	Client client.Client
	// APIReader reads past the cache, to tell a just-created pod from a missing one.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// Settings are the cluster's migration settings (Options.Settings), loaded at each
	// reconcile; nil means DefaultSettings(), and limits of 0 are the defaults.
	Settings *SettingsValue
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// LauncherImage is Options.LauncherImage.
	LauncherImage string
}

// throttleRecheck is how often a migration held by a limit looks again.
const throttleRecheck = 5 * time.Second

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations/status,verbs=get;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the migration controller and its field indexes with mgr.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	ctx := context.Background()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1alpha1.VirtualMachineInstanceMigration{}, indexVMIName, func(o client.Object) []string {
		return []string{o.(*v1alpha1.VirtualMachineInstanceMigration).Spec.VMIName}
	}); err != nil {
		return fmt.Errorf("index migrations by VMI name: %w", err)
	}
	if err := idx.IndexField(ctx, &v1alpha1.VirtualMachineInstanceMigration{}, indexUID, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return fmt.Errorf("index migrations by UID: %w", err)
	}
	r := &Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(ControllerName),
		Settings:  opts.Settings,
		// The current launcher image: a target pod runs it, not the source's.
		LauncherImage: opts.LauncherImage,
	}
	copts := controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = &opts.SkipNameValidation
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.VirtualMachineInstanceMigration{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.migrationsOfPod)).
		Watches(&v1alpha1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(r.migrationsOfVMI)).
		WithOptions(copts).
		Complete(r)
}

// migrationsOfPod maps a target pod to its migration (label → UID index).
func (r *Reconciler) migrationsOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	uid := o.GetLabels()[v1alpha1.MigrationUIDLabel]
	if uid == "" {
		return nil
	}
	return r.lookup(ctx, o.GetNamespace(), indexUID, uid)
}

// migrationsOfVMI maps a VMI to the migrations that name it.
func (r *Reconciler) migrationsOfVMI(ctx context.Context, o client.Object) []reconcile.Request {
	return r.lookup(ctx, o.GetNamespace(), indexVMIName, o.GetName())
}

func (r *Reconciler) lookup(ctx context.Context, ns, index, value string) []reconcile.Request {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{index: value}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list migrations", "index", index, "value", value)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, m := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Name}})
	}
	return reqs
}

// Reconcile moves one migration along its lifecycle.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	mig := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := r.Client.Get(ctx, req.NamespacedName, mig); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The finalizer is written before anything is created, so that a target pod never exists
	// for a migration that can vanish without deleting it.
	if mig.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(mig, Finalizer) {
		base := mig.DeepCopy()
		controllerutil.AddFinalizer(mig, Finalizer)
		if err := r.Client.Patch(ctx, mig, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{}, nil // the newer write re-queues the migration
			}
			return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("add finalizer: %w", err))
		}
	}
	before := mig.DeepCopy()
	defer func() {
		if err := r.patch(ctx, before, mig); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if !mig.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, mig)
	}
	return r.reconcileNormal(ctx, mig)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// throttled says which limit on parallel migrations holds mig back, "" when none does: the
// migrations past Pending and not final count, in the cluster and from the VMI's node.
func (r *Reconciler) throttled(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration, node string) (string, error) {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.Client.List(ctx, &list); err != nil {
		return "", fmt.Errorf("list migrations: %w", err)
	}
	cluster, fromNode := 0, 0
	for i := range list.Items {
		m := &list.Items[i]
		switch m.Status.Phase {
		case v1alpha1.MigrationPhaseUnset, v1alpha1.MigrationPending, v1alpha1.MigrationSucceeded, v1alpha1.MigrationFailed:
			continue
		}
		if m.UID == mig.UID {
			continue
		}
		cluster++
		if s := m.Status.MigrationState; s != nil && s.SourceNode == node {
			fromNode++
		}
	}
	settings := r.Settings.Load()
	perCluster, perNode := settings.ParallelMigrationsPerCluster, settings.ParallelOutboundMigrationsPerNode
	if perCluster <= 0 {
		perCluster = DefaultParallelMigrationsPerCluster
	}
	if perNode <= 0 {
		perNode = DefaultParallelOutboundMigrationsPerNode
	}
	switch {
	case cluster >= perCluster:
		return fmt.Sprintf("%d migrations run in the cluster, the most allowed at once (parallelMigrationsPerCluster)", cluster), nil
	case fromNode >= perNode:
		return fmt.Sprintf("%d migrations leave node %s, the most allowed at once (parallelOutboundMigrationsPerNode)", fromNode, node), nil
	}
	return "", nil
}

// inPhase is how long mig has been in phase p, 0 when it is in another.
func (r *Reconciler) inPhase(mig *v1alpha1.VirtualMachineInstanceMigration, p v1alpha1.VirtualMachineInstanceMigrationPhase) time.Duration {
	if mig.Status.Phase != p {
		return 0
	}
	for _, t := range mig.Status.PhaseTransitionTimestamps {
		if t.Phase == p {
			return r.now().Sub(t.PhaseTransitionTimestamp.Time)
		}
	}
	return 0
}

// patch writes what the reconcile changed: status first, then the finalizers (their removal;
// Reconcile adds the finalizer itself), since removing the last finalizer may delete the
// object. Each patch holds only its own part.
func (r *Reconciler) patch(ctx context.Context, before, mig *v1alpha1.VirtualMachineInstanceMigration) error {
	var errs []error
	if !equality.Semantic.DeepEqual(before.Status, mig.Status) {
		obj := before.DeepCopy()
		obj.Status = mig.Status
		if err := r.Client.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("patch migration status: %w", err))
		}
	}
	if !equality.Semantic.DeepEqual(before.Finalizers, mig.Finalizers) {
		obj := before.DeepCopy()
		obj.Finalizers = mig.Finalizers
		if err := r.Client.Patch(ctx, obj, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("patch migration finalizers: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) (ctrl.Result, error) {
	vmi, err := r.getVMI(ctx, mig)
	if err != nil {
		return ctrl.Result{}, err
	}
	state := migrationState(mig)
	obs := Observation{Phase: mig.Status.Phase, VMI: vmi, MigrationUID: string(mig.UID), TargetPodCreated: state.TargetPod != "",
		WaitingForNode: r.inPhase(mig, v1alpha1.MigrationTargetReady), Scheduling: r.inPhase(mig, v1alpha1.MigrationScheduling)}
	var source *corev1.Pod
	if vmi != nil && (mig.Status.Phase == v1alpha1.MigrationPending || mig.Status.Phase == v1alpha1.MigrationScheduling && !obs.TargetPodCreated) {
		if source, err = r.sourcePod(ctx, vmi, mig); err != nil {
			return ctrl.Result{}, err
		}
		obs.SourcePodFound = source != nil
	}
	if vmi != nil && mig.Status.Phase == v1alpha1.MigrationPending {
		if obs.Throttled, err = r.throttled(ctx, mig, vmi.Status.NodeName); err != nil {
			return ctrl.Result{}, err
		}
	}
	if obs.TargetPodCreated {
		if obs.TargetPod, err = r.getPod(ctx, mig.Namespace, state.TargetPod); err != nil {
			return ctrl.Result{}, err
		}
	}
	d := Next(obs)
	from := mig.Status.Phase
	setPhase(mig, d.Phase)

	switch d.Phase {
	case v1alpha1.MigrationPending:
		if d.Reason == ReasonThrottled {
			ctrl.LoggerFrom(ctx).V(1).Info("migration waits", "reason", d.Message)
			return ctrl.Result{RequeueAfter: throttleRecheck}, nil
		}
	case v1alpha1.MigrationScheduling:
		if obs.TargetPodCreated || source == nil {
			// Brought back at the pending timeout, if no pod event comes before.
			return ctrl.Result{RequeueAfter: TargetPodPendingTimeout - obs.Scheduling + time.Second}, nil
		}
		return ctrl.Result{}, r.createTarget(ctx, mig, vmi, source)
	case v1alpha1.MigrationTargetReady:
		state.TargetNode = obs.TargetPod.Spec.NodeName
		if from != d.Phase {
			r.Recorder.Eventf(mig, obs.TargetPod, corev1.EventTypeNormal, ReasonTargetReady, "Migrate",
				"target pod %s runs on node %s", state.TargetPod, state.TargetNode)
		}
		if err := r.configure(ctx, vmi, state); err != nil {
			return ctrl.Result{}, err
		}
		// Brought back at the node start timeout, if the node side has not started by then.
		return ctrl.Result{RequeueAfter: NodeStartTimeout - obs.WaitingForNode + time.Second}, r.handOff(ctx, vmi, state)
	case v1alpha1.MigrationRunning:
		state.StartTimestamp = vmi.Status.MigrationState.StartTimestamp
		if from != d.Phase {
			r.Recorder.Eventf(mig, related(vmi), corev1.EventTypeNormal, v1alpha1.ReasonMigrating, "Migrate", "the node side started moving the guest")
		}
	case v1alpha1.MigrationSucceeded:
		if from != d.Phase {
			vs := vmi.Status.MigrationState
			state.StartTimestamp, state.EndTimestamp, state.Completed = vs.StartTimestamp, vs.EndTimestamp, true
			r.Recorder.Eventf(mig, related(vmi), corev1.EventTypeNormal, v1alpha1.ReasonMigrated, "Migrate", "the guest runs on node %s", state.TargetNode)
		}
	case v1alpha1.MigrationFailed:
		if from != d.Phase {
			now := metav1.Now()
			state.Failed, state.FailureReason, state.EndTimestamp = true, d.Reason+": "+d.Message, &now
			r.Recorder.Eventf(mig, related(vmi), corev1.EventTypeWarning, d.Reason, "Migrate", "%s", d.Message)
		}
		// The guest stays on the source: the target pod has nothing to do any more.
		return ctrl.Result{}, errors.Join(r.deleteTargets(ctx, mig), r.failOnVMI(ctx, vmi, mig, state.FailureReason))
	}
	return ctrl.Result{}, nil
}

// configure resolves the settings the migration runs with (the cluster's, with the
// MigrationPolicy that selects the VMI applied) into state, once.
func (r *Reconciler) configure(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, state *v1alpha1.VirtualMachineInstanceMigrationState) error {
	if state.MigrationConfiguration != nil {
		return nil
	}
	var policies v1alpha1.MigrationPolicyList
	if err := r.Client.List(ctx, &policies); err != nil {
		return fmt.Errorf("list migration policies: %w", err)
	}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: vmi.Namespace}, ns); err != nil {
		return fmt.Errorf("get the VMI's namespace: %w", err)
	}
	state.MigrationConfiguration, state.MigrationPolicyName = Resolve(vmi, ns.Labels, policies.Items, r.Settings.Load()).Configuration()
	return nil
}

// reconcileDelete cancels an unfinished migration: it deletes the target pod, clears the VMI's
// migration state, and releases the finalizer once the target pod is gone. A succeeded
// migration's target pod now runs the guest and is left alone.
func (r *Reconciler) reconcileDelete(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) (ctrl.Result, error) {
	if mig.Status.Phase != v1alpha1.MigrationSucceeded {
		if mig.Status.Phase != v1alpha1.MigrationFailed {
			setAbortRequested(mig)
		}
		if err := r.deleteTargets(ctx, mig); err != nil {
			return ctrl.Result{}, err
		}
		vmi, err := r.getVMI(ctx, mig)
		if err != nil {
			return ctrl.Result{}, err
		}
		if err := r.clearOnVMI(ctx, vmi, mig); err != nil {
			return ctrl.Result{}, err
		}
		pods, err := r.targetPods(ctx, mig)
		if err != nil {
			return ctrl.Result{}, err
		}
		if len(pods) > 0 {
			// The pod's deletion event requeues the migration.
			return ctrl.Result{}, nil
		}
	}
	controllerutil.RemoveFinalizer(mig, Finalizer)
	return ctrl.Result{}, nil
}

func (r *Reconciler) getVMI(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: mig.Namespace, Name: mig.Spec.VMIName}, vmi)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get VMI: %w", err)
	}
	return vmi, nil
}

// getPod reads a pod from the cache and, when the cache does not have it, from the API server:
// a pod this controller just created may not have reached the cache yet.
func (r *Reconciler) getPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	err := r.Client.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, pod)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get target pod: %w", err)
	}
	return pod, nil
}

// sourcePod finds the launcher pod that runs the VMI now: labelled with the VMI's UID, not this
// migration's target, not terminating, preferring the one the VMI names, else the one on its node.
func (r *Reconciler) sourcePod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, mig *v1alpha1.VirtualMachineInstanceMigration) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	var onNode *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Labels[v1alpha1.MigrationUIDLabel] == string(mig.UID) {
			continue
		}
		if vmi.Status.LauncherPodName != "" && p.Name == vmi.Status.LauncherPodName {
			return p, nil
		}
		if p.Spec.NodeName != "" && p.Spec.NodeName == vmi.Status.NodeName && onNode == nil {
			onNode = p
		}
	}
	return onNode, nil
}

func (r *Reconciler) createTarget(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, source *corev1.Pod) error {
	pod := TargetPod(source, mig, vmi.Status.HypervisorDriver, len(vmi.Spec.LocalWritableDisks()) > 0, r.LauncherImage)
	err := r.Client.Create(ctx, pod)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		r.Recorder.Eventf(mig, related(vmi), corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, "Create", "create target pod %s: %v", pod.Name, err)
		return fmt.Errorf("create target pod: %w", err)
	}
	state := migrationState(mig)
	state.MigrationUID = mig.UID
	state.SourcePod, state.SourceNode, state.TargetPod = source.Name, source.Spec.NodeName, pod.Name
	r.Recorder.Eventf(mig, related(vmi), corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate, "Create", "created target pod %s", pod.Name)
	return nil
}

// targetPods lists the pods labelled with the migration's UID: what cancellation must remove.
func (r *Reconciler) targetPods(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(mig.Namespace), client.MatchingLabels{v1alpha1.MigrationUIDLabel: string(mig.UID)}); err != nil {
		return nil, fmt.Errorf("list target pods: %w", err)
	}
	return pods.Items, nil
}

func (r *Reconciler) deleteTargets(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) error {
	pods, err := r.targetPods(ctx, mig)
	if err != nil {
		return err
	}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			r.Recorder.Eventf(mig, p, corev1.EventTypeWarning, v1alpha1.ReasonFailedDelete, "Delete", "delete target pod %s: %v", p.Name, err)
			return fmt.Errorf("delete target pod: %w", err)
		}
		r.Recorder.Eventf(mig, p, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete, "Delete", "deleted target pod %s", p.Name)
	}
	return nil
}

// handOff records the migration on the VMI: the node side watches for it, copies the guest to
// the target pod, and writes startTimestamp, then completed or failed.
func (r *Reconciler) handOff(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, state *v1alpha1.VirtualMachineInstanceMigrationState) error {
	if cur := vmi.Status.MigrationState; cur != nil && cur.MigrationUID == state.MigrationUID {
		return nil
	}
	// Next failed this migration if another one's open state were on the VMI; the resourceVersion
	// precondition below covers one that arrived since this VMI was read.
	if cur := vmi.Status.MigrationState; cur != nil {
		// An earlier migration's state, finished (Next failed this one otherwise): the node
		// side's fields of it must not pass for this one's.
		if err := r.removeVMIState(ctx, vmi); err != nil {
			return err
		}
	}
	return r.patchVMIState(ctx, vmi, controllerState(state))
}

// removeVMIState removes status.migrationState from the VMI whole, whoever wrote its fields,
// preconditioned on the VMI's resourceVersion; vmi gets the new one.
func (r *Reconciler) removeVMIState(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	patch := fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q},"status":{"migrationState":null}}`, vmi.ResourceVersion)
	if err := r.Client.Status().Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("remove the VMI's earlier migration state: %w", err)
	}
	return nil
}

// failOnVMI marks the VMI's migration state failed when it is this migration's and still open,
// so that the node side stops.
func (r *Reconciler) failOnVMI(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, mig *v1alpha1.VirtualMachineInstanceMigration, reason string) error {
	if vmi == nil || vmi.Status.MigrationState == nil || vmi.Status.MigrationState.MigrationUID != mig.UID ||
		vmi.Status.MigrationState.Completed || vmi.Status.MigrationState.Failed {
		return nil
	}
	s := controllerState(vmi.Status.MigrationState)
	now := metav1.Now()
	s.Failed, s.FailureReason, s.EndTimestamp = true, reason, &now
	return r.patchVMIState(ctx, vmi, s)
}

// clearOnVMI removes this migration's unfinished state from the VMI (cancellation): what the
// migration controller wrote of it. What the node side wrote is the node side's to remove.
func (r *Reconciler) clearOnVMI(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, mig *v1alpha1.VirtualMachineInstanceMigration) error {
	if vmi == nil || vmi.Status.MigrationState == nil || vmi.Status.MigrationState.MigrationUID != mig.UID || vmi.Status.MigrationState.Completed {
		return nil
	}
	return r.removeVMIState(ctx, vmi)
}

// controllerState returns of s what the migration controller writes on the VMI: the hand-off
// (the migration's UID, source and target) and, of a migration it failed, failed,
// failureReason and endTimestamp. The rest (startTimestamp, completed, the end of a migration
// the node side finished) is the node side's.
func controllerState(s *v1alpha1.VirtualMachineInstanceMigrationState) *v1alpha1.VirtualMachineInstanceMigrationState {
	return &v1alpha1.VirtualMachineInstanceMigrationState{
		MigrationUID: s.MigrationUID,
		SourceNode:   s.SourceNode, SourcePod: s.SourcePod,
		TargetNode: s.TargetNode, TargetPod: s.TargetPod,
		MigrationConfiguration: s.MigrationConfiguration.DeepCopy(), MigrationPolicyName: s.MigrationPolicyName,
	}
}

// patchVMIState writes status.migrationState s by server-side apply under the migration
// controller's field manager: the fields of s are the controller's, the node side's are left
// alone, and those the controller no longer sets are removed. The VMI's resourceVersion is a
// precondition, since what s holds was decided on that VMI.
func (r *Reconciler) patchVMIState(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, s *v1alpha1.VirtualMachineInstanceMigrationState) error {
	body, err := v1alpha1.StatusApply(vmi, &v1alpha1.VirtualMachineInstanceStatus{MigrationState: s}, vmi.ResourceVersion)
	if err != nil {
		return err
	}
	if err := r.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body), client.FieldOwner(v1alpha1.MigrationControllerFieldManager)); err != nil {
		return fmt.Errorf("apply VMI migration state: %w", err)
	}
	return nil
}

// related is the VMI as an event's related object, or no object (not a typed nil) without one.
func related(vmi *v1alpha1.VirtualMachineInstance) runtime.Object {
	if vmi == nil {
		return nil
	}
	return vmi
}

func migrationState(mig *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigrationState {
	if mig.Status.MigrationState == nil {
		mig.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: mig.UID}
	}
	return mig.Status.MigrationState
}

func setPhase(mig *v1alpha1.VirtualMachineInstanceMigration, p v1alpha1.VirtualMachineInstanceMigrationPhase) {
	if mig.Status.Phase == p {
		return
	}
	mig.Status.Phase = p
	mig.Status.PhaseTransitionTimestamps = append(mig.Status.PhaseTransitionTimestamps,
		v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: p, PhaseTransitionTimestamp: metav1.Now()})
}

func setAbortRequested(mig *v1alpha1.VirtualMachineInstanceMigration) {
	if c := v1alpha1.FindCondition(mig.Status.Conditions, v1alpha1.VirtualMachineInstanceMigrationAbortRequested); c != nil && c.Status == corev1.ConditionTrue {
		return
	}
	now := metav1.Now()
	mig.Status.Conditions = v1alpha1.SetCondition(mig.Status.Conditions, v1alpha1.VirtualMachineInstanceMigrationCondition{
		Type: v1alpha1.VirtualMachineInstanceMigrationAbortRequested, Status: corev1.ConditionTrue,
		LastProbeTime: now, Reason: ReasonAbortRequested,
		Message: "the migration was deleted before it finished", ObservedGeneration: mig.Generation,
	}, now)
}
