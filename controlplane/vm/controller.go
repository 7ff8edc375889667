// Package vm is the VirtualMachine controller: it keeps a VM's VirtualMachineInstance per its run strategy and start/stop requests, and mirrors that VMI in the VM's status.
package vm

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName is the name of the controller (metrics, logs, events).
const ControllerName = "vm"

// Finalizer keeps a VM until its VMI is gone, so that deleting a VM stops its guest even where no
// garbage collector runs, and the VM shows Terminating meanwhile.
const Finalizer = v1alpha1.LabelPrefix + "virtualmachine-controller"

// Options configure the VM controller; the zero value is usable.
type Options struct {
	// MaxConcurrentReconciles is the number of VMs reconciled at once; 0 means 1.
	MaxConcurrentReconciles int
	// StartBackoff is the crash-loop delay after the first failed VMI under Always or
	// RerunOnFailure; it doubles with each further consecutive failure. 0 means 10s.
	StartBackoff time.Duration
	// MaxStartBackoff caps the crash-loop delay; 0 means 5m.
	MaxStartBackoff time.Duration
	// SkipNameValidation lets several managers in one process register a controller named "vm" (tests).
	SkipNameValidation bool
}

// reconciler reconciles VirtualMachines.
type reconciler struct {
	client   client.Client
	recorder recorder.EventRecorder
	backoff  Backoff
	now      func() time.Time
}

// SetupWithManager registers the VM controller with mgr: it watches VMs and the VMIs they control.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{
		client:   mgr.GetClient(),
		recorder: mgr.GetEventRecorder(ControllerName),
		backoff:  Backoff{Initial: opts.StartBackoff, Max: opts.MaxStartBackoff},
		now:      time.Now,
	}
	if r.backoff.Initial <= 0 {
		r.backoff.Initial = 10 * time.Second
	}
	if r.backoff.Max <= 0 {
		r.backoff.Max = 5 * time.Minute
	}
	r.backoff.Max = max(r.backoff.Max, r.backoff.Initial)
	copts := controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = ptr.To(true)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.VirtualMachine{}).
		Owns(&v1alpha1.VirtualMachineInstance{}).
		WithOptions(copts).
		Complete(r)
}

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines/status,verbs=patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one VM's VMI in line with its run strategy and requests, and writes its status.
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := r.client.Get(ctx, req.NamespacedName, vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vm.DeletionTimestamp == nil && !controllerutil.ContainsFinalizer(vm, Finalizer) {
		base := vm.DeepCopy()
		controllerutil.AddFinalizer(vm, Finalizer)
		if err := r.client.Patch(ctx, vm, client.MergeFrom(base)); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	before := vm.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, before, vm); err != nil && retErr == nil {
			retErr = err
		}
	}()

	vmi, foreign, err := r.getVMI(ctx, vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(vm, vmi, foreign, r.now(), r.backoff)
	vm.Status = d.Status
	if sf := d.Status.StartFailure; sf != nil && (before.Status.StartFailure == nil || before.Status.StartFailure.LastFailedVMIUID != sf.LastFailedVMIUID) {
		r.recorder.Eventf(vm, vmi, corev1.EventTypeWarning, v1alpha1.ReasonCrashLoopBackOff, "Backoff",
			"VMI failed %d time(s) in a row; next start not before %s", sf.ConsecutiveFailCount, sf.RetryAfterTimestamp.Format(time.RFC3339))
	}
	if vm.DeletionTimestamp != nil {
		return r.reconcileDelete(ctx, vm, vmi, d)
	}
	return r.reconcileNormal(ctx, vm, vmi, d)
}

// getVMI returns the VMI named like the VM when the VM controls it; foreign says one exists
// that the VM does not control.
func (r *reconciler) getVMI(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachineInstance, bool, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(vm), vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("get VMI: %w", err)
	}
	if ref := metav1.GetControllerOf(vmi); ref == nil || ref.UID != vm.UID {
		return nil, true, nil
	}
	return vmi, false, nil
}

func (r *reconciler) reconcileDelete(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, d Decision) (ctrl.Result, error) {
	if err := r.act(ctx, vm, vmi, d); err != nil {
		return ctrl.Result{}, err
	}
	if d.RemoveFinalizer && controllerutil.ContainsFinalizer(vm, Finalizer) {
		base := vm.DeepCopy()
		controllerutil.RemoveFinalizer(vm, Finalizer)
		if err := r.client.Patch(ctx, vm, client.MergeFrom(base)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
		}
	}
	return ctrl.Result{}, nil
}

func (r *reconciler) reconcileNormal(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, d Decision) (ctrl.Result, error) {
	if err := r.act(ctx, vm, vmi, d); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil
}

// act carries out the decision's action, records its event and the Failure condition.
func (r *reconciler) act(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, d Decision) error {
	now := r.now()
	switch d.Action {
	case ActionCreate:
		newVMI, err := NewVMI(vm)
		if err == nil {
			err = r.client.Create(ctx, newVMI)
		}
		if apierrors.IsAlreadyExists(err) {
			// The cache had not seen it yet; the watch brings it and another reconcile.
			return nil
		}
		if err != nil {
			setCondition(&vm.Status, vm.Generation, now, v1alpha1.VirtualMachineFailure, corev1.ConditionTrue, v1alpha1.ReasonFailedCreate, err.Error())
			r.recorder.Eventf(vm, nil, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate, "CreateVMI", "create VMI: %v", err)
			return fmt.Errorf("create VMI: %w", err)
		}
		removeCondition(&vm.Status, v1alpha1.VirtualMachineFailure, v1alpha1.ReasonFailedCreate, v1alpha1.ReasonFailedDelete)
		// Say so now rather than after the VMI's watch event brings the next reconcile.
		vm.Status.Created = true
		vm.Status.PrintableStatus = v1alpha1.VirtualMachineStatusStarting
		r.recorder.Eventf(vm, newVMI, corev1.EventTypeNormal, d.Reason, "CreateVMI", "created VMI %s: %s", newVMI.Name, d.Message)
	case ActionDelete:
		uid := vmi.UID
		err := r.client.Delete(ctx, vmi, client.Preconditions{UID: &uid})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			// Gone already, or replaced by a VMI this decision was not about.
			return nil
		}
		if err != nil {
			setCondition(&vm.Status, vm.Generation, now, v1alpha1.VirtualMachineFailure, corev1.ConditionTrue, v1alpha1.ReasonFailedDelete, err.Error())
			r.recorder.Eventf(vm, vmi, corev1.EventTypeWarning, v1alpha1.ReasonFailedDelete, "DeleteVMI", "delete VMI: %v", err)
			return fmt.Errorf("delete VMI: %w", err)
		}
		removeCondition(&vm.Status, v1alpha1.VirtualMachineFailure, v1alpha1.ReasonFailedCreate, v1alpha1.ReasonFailedDelete)
		r.recorder.Eventf(vm, vmi, corev1.EventTypeNormal, d.Reason, "DeleteVMI", "deleted VMI %s: %s", vmi.Name, d.Message)
	}
	return nil
}

// patchStatus writes the status when it changed. When the controller consumed state change
// requests it patches with the resourceVersion it read, so a request added meanwhile is never lost.
func (r *reconciler) patchStatus(ctx context.Context, before, vm *v1alpha1.VirtualMachine) error {
	if equality.Semantic.DeepEqual(before.Status, vm.Status) {
		return nil
	}
	var patch client.Patch = client.MergeFrom(before)
	if !equality.Semantic.DeepEqual(before.Status.StateChangeRequests, vm.Status.StateChangeRequests) {
		patch = client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	}
	if err := r.client.Status().Patch(ctx, vm, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch status: %w", err)
	}
	return nil
}

// NewVMI builds the VMI a VM runs: spec.template with the VM's name and namespace, the
// VirtualMachineNameLabel, the generation it came from, and the VM as its controller.
func NewVMI(vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachineInstance, error) {
	if vm.Spec.Template == nil {
		return nil, fmt.Errorf("spec.template is not set")
	}
	t := vm.Spec.Template.DeepCopy()
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name:        vm.Name,
			Namespace:   vm.Namespace,
			Labels:      t.ObjectMeta.Labels,
			Annotations: t.ObjectMeta.Annotations,
		},
		Spec: t.Spec,
	}
	if vmi.Labels == nil {
		vmi.Labels = map[string]string{}
	}
	vmi.Labels[v1alpha1.VirtualMachineNameLabel] = vm.Name
	if vmi.Annotations == nil {
		vmi.Annotations = map[string]string{}
	}
	vmi.Annotations[generationAnnotation] = strconv.FormatInt(vm.Generation, 10)
	vmi.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(vm, v1alpha1.VirtualMachineGroupVersionKind)}
	return vmi, nil
}
