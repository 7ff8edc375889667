// Package vmi is the VirtualMachineInstance controller: it resolves a VMI's HypervisorClass,
// creates and follows its launcher pod, and holds the VMI until the pod is gone.
package vmi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

// controllerName is the name of the controller (metrics, logs, events' reporting controller).
const controllerName = "vmi"

// awaitingClassIndex indexes the VMIs that have no launcher pod yet and are not final: the ones a
// new or changed HypervisorClass may unblock.
const awaitingClassIndex = "kubevisor.io/vmi-awaiting-class"

// claimIndex indexes the VMIs whose claims are looked at (checksClaims) by the names of the
// PersistentVolumeClaims their volumes use: the ones a claim's creation, binding or deletion
// concerns.
const claimIndex = "kubevisor.io/vmi-claims"

// nodeIndex indexes the VMIs by status.nodeName: the ones a change of their node's labels (the
// driver's live-migration label, LiveMigratable) concerns.
const nodeIndex = "kubevisor.io/vmi-node"

// Event actions (events.k8s.io/v1 wants one with every event).
const (
	actionCreate  = "Create"
	actionDelete  = "Delete"
	actionResolve = "ResolveHypervisorClass"
	actionFollow  = "FollowLauncherPod"
)

// Options configure the controller.
type Options struct {
	// Pod shapes the launcher pods.
	Pod launcherpod.Config
	// MaxConcurrentReconciles is how many VMIs are reconciled at once. Default 1.
	MaxConcurrentReconciles int
	// SkipNameValidation lets several managers in one process (tests) register the controller.
	SkipNameValidation bool
	// SELinuxCategories are how many MCS categories the VMIs' SELinux levels are made of
	// (mcs.NewAllocator). Default: all of them, mcs.Categories (1024).
	SELinuxCategories int
}

// reconciler reconciles VirtualMachineInstances.
type reconciler struct {
	client client.Client
	// apiReader reads past the cache, to tell a pod that is gone from one the cache has not seen yet.
	apiReader client.Reader
	events    recorder.EventRecorder
	opts      Options
	now       func() time.Time
	// created holds the VMIs (UID → time) whose launcher pod this controller created and its
	// cache has not shown yet, so that a reconcile in between, on a VMI read from the same
	// lagging cache, neither creates the pod again nor writes status from stale data. The pod's
	// event brings the VMI back; an entry older than createdTTL is dropped, in case that event
	// never comes (the pod was deleted before the cache saw it).
	created sync.Map
	// levels are the VMIs' SELinux levels, which their launcher pods run at.
	levels *levels
}

// createdTTL bounds how long a created pod is waited for in the cache.
const createdTTL = time.Minute

// SetupWithManager registers the controller, named "vmi", with mgr.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if opts.Pod.LauncherImage == "" {
		return errors.New("vmi controller: no launcher image configured")
	}
	if _, err := mcs.NewAllocator(opts.SELinuxCategories); err != nil {
		return fmt.Errorf("vmi controller: SELinux levels: %w", err)
	}
	r := &reconciler{
		client:    mgr.GetClient(),
		apiReader: mgr.GetAPIReader(),
		events:    mgr.GetEventRecorder(controllerName),
		opts:      opts,
		now:       time.Now,
		levels:    &levels{reader: mgr.GetAPIReader(), categories: opts.SELinuxCategories},
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstance{}, awaitingClassIndex,
		func(o client.Object) []string {
			vmi := o.(*v1alpha1.VirtualMachineInstance)
			if vmi.Status.LauncherPodName == "" && !vmi.Status.Phase.IsFinal() && vmi.DeletionTimestamp == nil {
				return []string{"true"}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("vmi controller: index VMIs awaiting a class: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstance{}, claimIndex,
		func(o client.Object) []string {
			vmi := o.(*v1alpha1.VirtualMachineInstance)
			if !checksClaims(vmi) {
				return nil
			}
			var names []string
			for _, ref := range claimRefs(vmi) {
				names = append(names, ref.Claim)
			}
			return names
		}); err != nil {
		return fmt.Errorf("vmi controller: index VMIs by claim: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstance{}, nodeIndex,
		func(o client.Object) []string {
			if n := o.(*v1alpha1.VirtualMachineInstance).Status.NodeName; n != "" {
				return []string{n}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("vmi controller: index VMIs by node: %w", err)
	}
	copts := controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = &opts.SkipNameValidation
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&v1alpha1.VirtualMachineInstance{}).
		Owns(&corev1.Pod{}).
		Watches(&v1alpha1.HypervisorClass{}, handler.EnqueueRequestsFromMapFunc(r.vmisAwaitingClass)).
		Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(r.vmisUsingClaim),
			builder.WithPredicates(claimPhaseChanged)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.vmisOnNode),
			builder.WithPredicates(migrationLabelsChanged)).
		WithOptions(copts).
		Complete(r)
}

// vmisAwaitingClass maps a HypervisorClass event to the VMIs that wait for a class.
func (r *reconciler) vmisAwaitingClass(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.vmiRequests(ctx, "awaiting a HypervisorClass", client.MatchingFields{awaitingClassIndex: "true"})
}

// vmiRequests are the requests of the VMIs the cache lists with opts; a listing that fails is
// logged (what: which VMIs) and brings none.
func (r *reconciler) vmiRequests(ctx context.Context, what string, opts ...client.ListOption) []reconcile.Request {
	var list v1alpha1.VirtualMachineInstanceList
	if err := r.client.List(ctx, &list, opts...); err != nil {
		log.FromContext(ctx).Error(err, "list VMIs "+what)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, vmi := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}})
	}
	return reqs
}

// claimPhaseChanged lets through a claim's creation and deletion, and the updates that change its
// phase: all that claimsProblem reads of it.
var claimPhaseChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		oldPVC, ok1 := e.ObjectOld.(*corev1.PersistentVolumeClaim)
		newPVC, ok2 := e.ObjectNew.(*corev1.PersistentVolumeClaim)
		return !ok1 || !ok2 || oldPVC.Status.Phase != newPVC.Status.Phase
	},
}

// vmisUsingClaim maps a PersistentVolumeClaim event to the VMIs not yet Scheduled whose volumes use it.
func (r *reconciler) vmisUsingClaim(ctx context.Context, o client.Object) []reconcile.Request {
	return r.vmiRequests(ctx, "using PersistentVolumeClaim "+o.GetNamespace()+"/"+o.GetName(),
		client.InNamespace(o.GetNamespace()), client.MatchingFields{claimIndex: o.GetName()})
}

// migrationLabelsChanged lets through a node's creation and deletion, and the updates that change
// one of its drivers' live-migration labels: all that driverMigrates reads of it.
var migrationLabelsChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		changed := func(a, b map[string]string) bool {
			for k, v := range a {
				if strings.HasPrefix(k, v1alpha1.CapabilityLabelPrefix) && (strings.HasSuffix(k, migrationLabelSuffix) || strings.HasSuffix(k, migrationDisksLabelSuffix)) && b[k] != v {
					return true
				}
			}
			return false
		}
		return changed(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) || changed(e.ObjectNew.GetLabels(), e.ObjectOld.GetLabels())
	},
}

// migrationLabelSuffix and migrationDisksLabelSuffix end every driver's live-migration labels.
var (
	migrationLabelSuffix      = strings.TrimPrefix(v1alpha1.DriverMigrationLabel(""), v1alpha1.CapabilityLabelPrefix)
	migrationDisksLabelSuffix = strings.TrimPrefix(v1alpha1.DriverMigrationDisksLabel(""), v1alpha1.CapabilityLabelPrefix)
)

// vmisOnNode maps a Node event to the VMIs on that node.
func (r *reconciler) vmisOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	return r.vmiRequests(ctx, "on node "+o.GetName(), client.MatchingFields{nodeIndex: o.GetName()})
}

// driverMigrates reads, from the cache, whether the VMI's hypervisor driver declares live
// migration on the VMI's node, and whether it copies disks in one (v1alpha1.DriverMigrationLabel,
// DriverMigrationDisksLabel): nil when the VMI has no node or driver yet, or the node no such
// label (a handler that has not said, or is gone).
func (r *reconciler) driverMigrates(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (migrates, disks *bool, err error) {
	if vmi.Status.NodeName == "" || vmi.Status.HypervisorDriver == "" {
		return nil, nil, nil
	}
	node := &corev1.Node{}
	switch err := r.client.Get(ctx, types.NamespacedName{Name: vmi.Status.NodeName}, node); {
	case apierrors.IsNotFound(err):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("get node %s: %w", vmi.Status.NodeName, err)
	}
	label := func(key string) *bool {
		v, err := strconv.ParseBool(node.Labels[key])
		if err != nil {
			return nil
		}
		return &v
	}
	return label(v1alpha1.DriverMigrationLabel(vmi.Status.HypervisorDriver)), label(v1alpha1.DriverMigrationDisksLabel(vmi.Status.HypervisorDriver)), nil
}

// RBAC: exactly what Reconcile and the watches use; the envtest suite runs the controller with
// nothing more. virtualmachineinstances/finalizers update lets the API server accept pods whose
// owner reference blocks the VMI's deletion (OwnerReferencesPermissionEnforcement).
//
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevisor.io,resources=hypervisorclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one VMI's launcher pod and status in line (get → finalizer → deferred patch →
// delete or normal).
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.client.Get(ctx, req.NamespacedName, vmi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The finalizer is written before anything is created, so that a pod never exists for a VMI
	// that can vanish without waiting for it.
	if vmi.DeletionTimestamp == nil && !controllerutil.ContainsFinalizer(vmi, v1alpha1.TeardownFinalizer) {
		base := vmi.DeepCopy()
		controllerutil.AddFinalizer(vmi, v1alpha1.TeardownFinalizer)
		if err := r.client.Patch(ctx, vmi, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{}, nil // the newer write re-queues the VMI
			}
			return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("add finalizer: %w", err))
		}
	}

	p := newPatcher(vmi)
	defer func() {
		err := p.patch(ctx, r.client, vmi)
		if apierrors.IsConflict(err) && !v1alpha1.IsFieldConflict(err) {
			// The VMI changed since it was read (the handler wrote its status): that write is an
			// event that brings the VMI back, to be decided again on what it now holds.
			log.FromContext(ctx).V(1).Info("VMI changed while it was reconciled", "error", err.Error())
			err = nil
		}
		retErr = errors.Join(retErr, err)
	}()

	if vmi.DeletionTimestamp != nil {
		return r.reconcileDelete(ctx, vmi)
	}
	return r.reconcileNormal(ctx, vmi)
}

// reconcileNormal creates the launcher pod once and follows it.
func (r *reconciler) reconcileNormal(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (ctrl.Result, error) {
	if vmi.Status.Phase.IsFinal() {
		// Nothing runs any more: free the node. The handler's teardown holds the pod (its own
		// finalizer) as long as it needs to.
		r.created.Delete(vmi.UID)
		if err := r.deletePods(ctx, vmi); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.releaseLevel(ctx, vmi)
	}
	if err := r.followMigration(ctx, vmi); err != nil {
		return ctrl.Result{}, err
	}
	var obs observation
	pod, err := r.launcherPod(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, err
	}
	if pod != nil {
		r.created.Delete(vmi.UID)
	} else if at, ok := r.created.Load(vmi.UID); ok && vmi.Status.LauncherPodName == "" {
		if wait := createdTTL - r.now().Sub(at.(time.Time)); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		r.created.Delete(vmi.UID)
	}
	obs.Pod = pod
	if obs.VolumeClaims, err = r.volumeClaims(ctx, vmi); err != nil {
		return ctrl.Result{}, err
	}
	if obs.DriverMigrates, obs.DriverMigratesDisks, err = r.driverMigrates(ctx, vmi); err != nil {
		return ctrl.Result{}, err
	}
	if checksClaims(vmi) {
		obs.ClaimProblem, obs.Claims = claimsProblem(vmi.Namespace, claimRefs(vmi), obs.VolumeClaims), obs.VolumeClaims
	}
	if pod == nil && vmi.Status.LauncherPodName != "" {
		obs.PodGone = true
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, v1alpha1.ReasonPodNotExists, actionFollow,
			"launcher pod %s was deleted before the VMI finished", vmi.Status.LauncherPodName)
	}
	var createErr error
	switch {
	case pod != nil || obs.PodGone:
	case obs.ClaimProblem.holdsPod():
		// A claim event brings the VMI back.
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, obs.ClaimProblem.Reason, actionCreate,
			"%s; the launcher pod is created once it exists", obs.ClaimProblem.Message)
	default:
		createErr = r.createPod(ctx, vmi, &obs)
	}
	if pod := obs.Pod; pod != nil && pod.Status.Phase == corev1.PodFailed && vmi.Status.Phase != v1alpha1.Failed {
		r.events.Eventf(vmi, pod, corev1.EventTypeWarning, v1alpha1.ReasonPodFailed, actionFollow,
			"launcher pod %s %s", pod.Name, describePodEnd(pod))
	}

	vmi.Status = deriveStatus(vmi, obs, metav1.NewTime(r.now()))
	// The node's handler selects its VMIs by this label: it is set once the pod is bound, before
	// status.nodeName (Scheduled), so that the handler has the VMI when the pod runs.
	node := vmi.Status.NodeName
	if node == "" && obs.Pod != nil && !podDown(obs.Pod) {
		node = obs.Pod.Spec.NodeName
	}
	if node != "" && vmi.Labels[v1alpha1.NodeNameLabel] != node {
		if vmi.Labels == nil {
			vmi.Labels = map[string]string{}
		}
		vmi.Labels[v1alpha1.NodeNameLabel] = node
	}
	// A failed create is in the status (LauncherPodCreated=False); returning it also retries with backoff.
	return ctrl.Result{}, createErr
}

// followMigration moves the VMI to the target of a completed live migration: its launcher pod
// becomes the target pod and its node the target node (with the node label, by which the target
// node's handler takes the VMI over and the source's lets it go), and the source pod is deleted.
// The node side reported the completion once the guest ran on the target.
func (r *reconciler) followMigration(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	ms := vmi.Status.MigrationState
	if ms == nil || !ms.Completed || ms.TargetPod == "" || ms.TargetNode == "" || vmi.Status.LauncherPodName == ms.TargetPod {
		return nil
	}
	if vmi.Status.LauncherPodName != "" && vmi.Status.LauncherPodName != ms.SourcePod {
		return nil // the VMI moved on since: this state is an old one's
	}
	vmi.Status.LauncherPodName, vmi.Status.NodeName = ms.TargetPod, ms.TargetNode
	r.events.Eventf(vmi, nil, corev1.EventTypeNormal, v1alpha1.ReasonMigrated, actionFollow,
		"the VMI migrated from node %s (pod %s) to node %s (pod %s)", ms.SourceNode, ms.SourcePod, ms.TargetNode, ms.TargetPod)
	if ms.SourcePod == "" {
		return nil
	}
	src := &corev1.Pod{}
	err := r.client.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: ms.SourcePod}, src)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get the migration's source pod: %w", err)
	case src.Labels[v1alpha1.CreatedByLabel] != string(vmi.UID) || src.DeletionTimestamp != nil:
		return nil
	}
	if err := r.client.Delete(ctx, src, client.Preconditions{UID: &src.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete the migration's source pod %s: %w", src.Name, err)
	}
	r.events.Eventf(vmi, src, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete, actionDelete, "deleted launcher pod %s: the VMI migrated away from it", src.Name)
	return nil
}

// launcherPod returns the VMI's launcher pod: the one status.launcherPodName names (a migration
// may have moved it), else the one Build names. A pod not created for this VMI does not count.
// Before a pod that the status names is declared gone, the API server is asked, since the cache
// may not have seen a pod created a moment ago.
func (r *reconciler) launcherPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	name := vmi.Status.LauncherPodName
	if name == "" {
		name = launcherpod.Name(vmi.Name, vmi.UID)
	}
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: name}
	pod := &corev1.Pod{}
	err := r.client.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) && vmi.Status.LauncherPodName != "" {
		err = r.apiReader.Get(ctx, key, pod)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get launcher pod: %w", err)
	case pod.Labels[v1alpha1.CreatedByLabel] != string(vmi.UID):
		if vmi.Status.LauncherPodName != "" {
			return nil, nil // ours is gone; the name is someone else's now
		}
		return nil, fmt.Errorf("launcher pod %s exists and was not created for this VMI (uid %s)", name, vmi.UID)
	}
	return pod, nil
}

// volumeClaims reads, from the cache, the PersistentVolumeClaims the VMI's volumes use, and
// returns those that exist, by name.
func (r *reconciler) volumeClaims(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (map[string]*corev1.PersistentVolumeClaim, error) {
	refs := claimRefs(vmi)
	found := make(map[string]*corev1.PersistentVolumeClaim, len(refs))
	for _, ref := range refs {
		pvc := &corev1.PersistentVolumeClaim{}
		err := r.client.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: ref.Claim}, pvc)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("get PersistentVolumeClaim %s: %w", ref.Claim, err)
		default:
			found[ref.Claim] = pvc
		}
	}
	return found, nil
}

// createPod resolves the class, builds the pod and creates it, recording the outcome in obs.
func (r *reconciler) createPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, obs *observation) error {
	class, prob, err := r.resolveClass(ctx, vmi)
	if err != nil {
		return err
	}
	if prob != nil {
		obs.ClassProblem = prob
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, prob.Reason, actionResolve, "%s", prob.Message)
		return nil // a class event re-queues the VMI
	}
	obs.ClassName, obs.Driver = class.Name, class.Driver
	if err := r.ensureStateClaim(ctx, vmi); err != nil {
		obs.CreateProblem = &problem{Reason: v1alpha1.ReasonFailedCreate, Message: err.Error()}
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, actionCreate, "%s", obs.CreateProblem.Message)
		return err
	}
	level, err := r.levels.allocate(ctx, vmi.UID)
	if err != nil {
		obs.CreateProblem = &problem{Reason: v1alpha1.ReasonFailedCreate, Message: "allocate an SELinux level: " + err.Error()}
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, actionCreate, "%s", obs.CreateProblem.Message)
		return fmt.Errorf("allocate an SELinux level: %w", err)
	}
	// The pod's level (launcherpod.Build reads it there), recorded with the status.
	vmi.Status.SELinuxLevel = level.String()
	pod, err := launcherpod.Build(vmi, class, r.opts.Pod)
	if err != nil {
		obs.CreateProblem = &problem{Reason: v1alpha1.ReasonFailedCreate, Message: "build launcher pod: " + err.Error()}
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, actionCreate, "%s", obs.CreateProblem.Message)
		// The inputs do not change without an event on the VMI or class: no point retrying.
		return nil
	}
	err = r.client.Create(ctx, pod)
	if apierrors.IsAlreadyExists(err) {
		// Created by an earlier pass that the cache has not caught up with.
		err = r.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err == nil && pod.Labels[v1alpha1.CreatedByLabel] != string(vmi.UID) {
			err = fmt.Errorf("pod %s exists and was not created for this VMI", pod.Name)
		}
		if err == nil {
			obs.Pod = pod
			return nil
		}
	}
	if err != nil {
		obs.CreateProblem = &problem{Reason: v1alpha1.ReasonFailedCreate, Message: fmt.Sprintf("create launcher pod %s: %v", pod.Name, err)}
		r.events.Eventf(vmi, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, actionCreate, "%s", obs.CreateProblem.Message)
		return fmt.Errorf("create launcher pod: %w", err)
	}
	obs.Pod = pod
	r.created.Store(vmi.UID, r.now())
	r.events.Eventf(vmi, pod, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate, actionCreate,
		"created launcher pod %s (HypervisorClass %s)", pod.Name, class.Name)
	return nil
}

// ensureStateClaim creates the persistent state claim of a VMI that keeps a persistent TPM or
// EFI variables (launcherpod.StateClaim) when it does not exist: the VM's first VMI makes it,
// the next ones find it. A claim of that name made beforehand (say, of another storage class) is
// used as it is.
func (r *reconciler) ensureStateClaim(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	claim := launcherpod.StateClaim(vmi, r.opts.Pod)
	if claim == nil {
		return nil
	}
	err := r.client.Get(ctx, client.ObjectKeyFromObject(claim), &corev1.PersistentVolumeClaim{})
	if !apierrors.IsNotFound(err) {
		if err != nil {
			return fmt.Errorf("get persistent state claim %s: %w", claim.Name, err)
		}
		return nil
	}
	if err := r.client.Create(ctx, claim); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create persistent state claim %s: %w", claim.Name, err)
	}
	r.events.Eventf(vmi, claim, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate, actionCreate,
		"created persistent state claim %s for the TPM state and EFI variables that outlive the VMI", claim.Name)
	return nil
}

// resolveClass finds the VMI's HypervisorClass: the named one, else the single default. A
// missing, ambiguous or absent class is a problem for the VMI's status, not an error.
func (r *reconciler) resolveClass(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*v1alpha1.HypervisorClass, *problem, error) {
	if name := vmi.Spec.HypervisorClassName; name != "" {
		class := &v1alpha1.HypervisorClass{}
		err := r.client.Get(ctx, types.NamespacedName{Name: name}, class)
		if apierrors.IsNotFound(err) {
			return nil, &problem{Reason: v1alpha1.ReasonHypervisorClassNotFound, Message: fmt.Sprintf("HypervisorClass %q not found", name)}, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("get HypervisorClass: %w", err)
		}
		return class, nil, nil
	}
	var list v1alpha1.HypervisorClassList
	if err := r.client.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list HypervisorClasses: %w", err)
	}
	class, prob := defaultClass(list.Items)
	return class, prob, nil
}

// defaultClass picks the one HypervisorClass annotated default among classes.
func defaultClass(classes []v1alpha1.HypervisorClass) (*v1alpha1.HypervisorClass, *problem) {
	var defaults []*v1alpha1.HypervisorClass
	for i := range classes {
		if v1alpha1.IsDefaultClass(&classes[i]) && classes[i].DeletionTimestamp == nil {
			defaults = append(defaults, &classes[i])
		}
	}
	switch len(defaults) {
	case 0:
		return nil, &problem{Reason: v1alpha1.ReasonHypervisorClassNotFound,
			Message: fmt.Sprintf("the VMI names no HypervisorClass and none is annotated %s=true", v1alpha1.IsDefaultHypervisorClassAnnotation)}
	case 1:
		return defaults[0], nil
	}
	names := make([]string, len(defaults))
	for i, c := range defaults {
		names[i] = c.Name
	}
	sort.Strings(names)
	return nil, &problem{Reason: v1alpha1.ReasonMultipleDefaultHypervisorClasses,
		Message: fmt.Sprintf("the VMI names no HypervisorClass and several are default: %s", strings.Join(names, ", "))}
}

// reconcileDelete deletes the VMI's pods (the handler tears the VM down while they terminate)
// and lets the VMI go once none is left.
func (r *reconciler) reconcileDelete(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (ctrl.Result, error) {
	r.created.Delete(vmi.UID)
	if !controllerutil.ContainsFinalizer(vmi, v1alpha1.TeardownFinalizer) {
		return ctrl.Result{}, nil
	}
	if err := r.deletePods(ctx, vmi); err != nil {
		return ctrl.Result{}, err
	}
	pods, err := r.pods(ctx, vmi, r.client)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(pods) > 0 {
		return ctrl.Result{}, nil // the pods' deletion events bring the VMI back
	}
	// Ask the API server too: the cache may lag behind a pod created just before the deletion.
	if pods, err = r.pods(ctx, vmi, r.apiReader); err != nil || len(pods) > 0 {
		return ctrl.Result{RequeueAfter: time.Second}, err
	}
	r.levels.release(vmi.UID)
	controllerutil.RemoveFinalizer(vmi, v1alpha1.TeardownFinalizer)
	return ctrl.Result{}, nil
}

// releaseLevel releases the SELinux level of a VMI that ended, once it has no launcher pod left
// (the cache's word, then the API server's: a pod the cache has not seen yet still runs at it).
// The deletion of its last pod brings the VMI back here.
func (r *reconciler) releaseLevel(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	if !r.levels.holds(vmi.UID) {
		return nil
	}
	for _, c := range []client.Reader{r.client, r.apiReader} {
		pods, err := r.pods(ctx, vmi, c)
		if err != nil || len(pods) > 0 {
			return err
		}
	}
	r.levels.release(vmi.UID)
	return nil
}

// pods lists every pod created for the VMI (the launcher pod and migration targets).
func (r *reconciler) pods(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, c client.Reader) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(vmi.Namespace), client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	return list.Items, nil
}

// deletePods deletes the VMI's pods that are not already going.
func (r *reconciler) deletePods(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	pods, err := r.pods(ctx, vmi, r.client)
	if err != nil {
		return err
	}
	var errs []error
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		// Preconditioned on the UID: a pod of the same name made since is not ours to delete.
		err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		case err != nil:
			r.events.Eventf(vmi, pod, corev1.EventTypeWarning, v1alpha1.ReasonFailedDelete, actionDelete, "delete launcher pod %s: %v", pod.Name, err)
			errs = append(errs, fmt.Errorf("delete launcher pod %s: %w", pod.Name, err))
		default:
			r.events.Eventf(vmi, pod, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete, actionDelete, "deleted launcher pod %s", pod.Name)
		}
	}
	return errors.Join(errs...)
}

// patcher writes what a reconcile changed in a VMI when it ends (cluster-api's patch helper, cut
// down): metadata (labels, finalizers) as a merge patch, and the fields of status the
// controller owns by server-side apply (applyStatus), each only when it changed and with the
// VMI's resourceVersion as a precondition, since a decision made on a stale VMI is no decision.
type patcher struct {
	before *v1alpha1.VirtualMachineInstance
}

func newPatcher(vmi *v1alpha1.VirtualMachineInstance) *patcher {
	return &patcher{before: vmi.DeepCopy()}
}

func (p *patcher) patch(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance) error {
	status := vmi.Status.DeepCopy()
	if !equality.Semantic.DeepEqual(p.before.Labels, vmi.Labels) || !slices.Equal(p.before.Finalizers, vmi.Finalizers) {
		base := p.before.DeepCopy()
		changed := p.before.DeepCopy()
		changed.Labels, changed.Finalizers = vmi.Labels, vmi.Finalizers
		if err := c.Patch(ctx, changed, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) {
				return nil // the finalizer was the last thing holding it
			}
			return fmt.Errorf("patch VMI metadata: %w", err)
		}
		// The status apply below is based on what the API server now holds.
		p.before = changed.DeepCopy()
		changed.Status = *status
		changed.DeepCopyInto(vmi)
	}
	if vmi.DeletionTimestamp != nil && len(vmi.Finalizers) == 0 {
		return nil // gone
	}
	return applyStatus(ctx, c, p.before, *status, vmi)
}

// applyStatus writes of st, the status deriveStatus made from stored, the fields the controller
// owns, and leaves vmi as the API server then holds it. The lifecycle fields are among them
// while no node handler owns them, and when st ends the VMI: the controller then takes them over
// (forced), preconditioned on the resourceVersion it decided on, so that it ends only the VMI it
// saw; the API server refuses anything that changes a final phase. Once it does not own them, an
// apply that leaves them out gives up what it still shares of them.
func applyStatus(ctx context.Context, c client.Client, stored *v1alpha1.VirtualMachineInstance, st v1alpha1.VirtualMachineInstanceStatus, vmi *v1alpha1.VirtualMachineInstance) error {
	alone := v1alpha1.HoldsLifecycle(stored, v1alpha1.VMIControllerFieldManager)
	mine := v1alpha1.SharesLifecycle(stored, v1alpha1.VMIControllerFieldManager)
	ending := st.Phase.IsFinal() && !stored.Status.Phase.IsFinal()
	lifecycle := alone || ending
	want := controllerFields(st, lifecycle)
	body, err := v1alpha1.StatusApply(stored, &want, stored.ResourceVersion)
	if err != nil {
		return err
	}
	have := controllerFields(stored.Status, lifecycle)
	current, err := v1alpha1.StatusApply(stored, &have, stored.ResourceVersion)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(body.Object, current.Object) && (lifecycle || !mine) {
		vmi.Status = st
		return nil
	}
	opts := []client.SubResourceApplyOption{client.FieldOwner(v1alpha1.VMIControllerFieldManager)}
	if lifecycle && !alone {
		opts = append(opts, client.ForceOwnership)
	}
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body), opts...); err != nil {
		return fmt.Errorf("apply VMI status: %w", err)
	}
	out := &v1alpha1.VirtualMachineInstance{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(body.Object, out); err != nil {
		return fmt.Errorf("decode applied VMI: %w", err)
	}
	out.DeepCopyInto(vmi)
	return nil
}
