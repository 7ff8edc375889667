// Package vmirs is the VirtualMachineInstanceReplicaSet controller: it keeps spec.replicas VMIs from the template, replaces finished ones, and reports counts for the scale subresource.
package vmirs

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName is the name of the controller (metrics, logs, events).
const ControllerName = "vmirs"

// defaultBurst is how many VMIs one reconcile creates or deletes at most (KubeVirt's BurstReplicas).
const defaultBurst = 250

// Options configure the replica set controller; the zero value is usable.
type Options struct {
	// MaxConcurrentReconciles is the number of replica sets reconciled at once; 0 means 1.
	MaxConcurrentReconciles int
	// BurstReplicas caps the VMIs created plus deleted in one reconcile; 0 means 250.
	BurstReplicas int
	// SkipNameValidation lets several managers in one process register a controller named "vmirs" (tests).
	SkipNameValidation bool
}

// reconciler reconciles VirtualMachineInstanceReplicaSets.
type reconciler struct {
	client client.Client
	// reader lists VMIs from the API server rather than the cache: a cache that has not yet seen
	// the VMIs just created would make the next reconcile create them again.
	reader   client.Reader
	recorder recorder.EventRecorder
	burst    int
	now      func() time.Time
}

// SetupWithManager registers the replica set controller with mgr: it watches replica sets and the VMIs they control.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{
		client:   mgr.GetClient(),
		reader:   mgr.GetAPIReader(),
		recorder: mgr.GetEventRecorder(ControllerName),
		burst:    opts.BurstReplicas,
		now:      time.Now,
	}
	if r.burst <= 0 {
		r.burst = defaultBurst
	}
	copts := controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = ptr.To(true)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.VirtualMachineInstanceReplicaSet{}).
		Owns(&v1alpha1.VirtualMachineInstance{}).
		WithOptions(copts).
		Complete(r)
}

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancereplicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancereplicasets/status,verbs=patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancereplicasets/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile creates, deletes and replaces one replica set's VMIs and writes its status. There is
// no finalizer: the VMIs carry the replica set as owner, so the garbage collector removes them.
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	rs := &v1alpha1.VirtualMachineInstanceReplicaSet{}
	if err := r.client.Get(ctx, req.NamespacedName, rs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if rs.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}

	before := rs.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, before, rs); err != nil && retErr == nil {
			retErr = err
		}
	}()

	vmis, err := r.ownedVMIs(ctx, rs)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(rs, vmis, r.burst, r.now())
	rs.Status = d.Status
	if err := r.act(ctx, rs, d); err != nil {
		return ctrl.Result{}, err
	}
	if d.Capped {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// ownedVMIs lists the VMIs the selector matches and that the replica set controls. With an
// unusable selector it returns those the replica set controls, for the counts.
func (r *reconciler) ownedVMIs(ctx context.Context, rs *v1alpha1.VirtualMachineInstanceReplicaSet) ([]*v1alpha1.VirtualMachineInstance, error) {
	opts := []client.ListOption{client.InNamespace(rs.Namespace)}
	if sel, err := Selector(rs); err == nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	list := &v1alpha1.VirtualMachineInstanceList{}
	if err := r.reader.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("list VMIs: %w", err)
	}
	var out []*v1alpha1.VirtualMachineInstance
	for i := range list.Items {
		if ref := metav1.GetControllerOf(&list.Items[i]); ref != nil && ref.UID == rs.UID {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// act creates and deletes VMIs as decided, with an event for each, and sets ReplicaFailure from
// the outcome. It goes on after a failure so one bad VMI does not block the others.
func (r *reconciler) act(ctx context.Context, rs *v1alpha1.VirtualMachineInstanceReplicaSet, d Decision) error {
	var errs []error
	failReason := ""
	for _, vmi := range d.Delete {
		uid := vmi.UID
		err := r.client.Delete(ctx, vmi, client.Preconditions{UID: &uid})
		switch {
		case err == nil:
			r.recorder.Eventf(rs, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete, "DeleteVMI", "deleted VMI %s (phase %q)", vmi.Name, vmi.Status.Phase)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			failReason = v1alpha1.ReasonFailedDelete
			r.recorder.Eventf(rs, vmi, corev1.EventTypeWarning, v1alpha1.ReasonFailedDelete, "DeleteVMI", "delete VMI %s: %v", vmi.Name, err)
			errs = append(errs, fmt.Errorf("delete VMI %s: %w", vmi.Name, err))
		}
	}
	for range d.Create {
		vmi := NewVMI(rs)
		if err := r.client.Create(ctx, vmi); err != nil {
			failReason = v1alpha1.ReasonFailedCreate
			r.recorder.Eventf(rs, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, "CreateVMI", "create VMI: %v", err)
			errs = append(errs, fmt.Errorf("create VMI: %w", err))
			// The same error would most likely repeat for the rest (quota, webhook).
			break
		}
		r.recorder.Eventf(rs, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate, "CreateVMI", "created VMI %s", vmi.Name)
	}
	if err := errors.Join(errs...); err != nil {
		setCondition(&rs.Status, rs.Generation, r.now(), v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, corev1.ConditionTrue, failReason, err.Error())
		return err
	}
	if d.Create > 0 || len(d.Delete) > 0 {
		removeCondition(&rs.Status, v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, v1alpha1.ReasonFailedCreate, v1alpha1.ReasonFailedDelete)
	}
	return nil
}

// patchStatus writes the status when it changed.
func (r *reconciler) patchStatus(ctx context.Context, before, rs *v1alpha1.VirtualMachineInstanceReplicaSet) error {
	if equality.Semantic.DeepEqual(before.Status, rs.Status) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, rs, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch status: %w", err)
	}
	return nil
}

// NewVMI builds one VMI of the replica set: the template, named "<replica set>-<random>", with
// the replica set as its controller.
func NewVMI(rs *v1alpha1.VirtualMachineInstanceReplicaSet) *v1alpha1.VirtualMachineInstance {
	t := rs.Spec.Template.DeepCopy()
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    rs.Name + "-",
			Namespace:       rs.Namespace,
			Labels:          t.ObjectMeta.Labels,
			Annotations:     t.ObjectMeta.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, v1alpha1.VirtualMachineInstanceReplicaSetGroupVersionKind)},
		},
		Spec: t.Spec,
	}
}
