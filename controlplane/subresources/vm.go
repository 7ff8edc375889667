package subresources

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/vm"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines,verbs=get;patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachines/status,verbs=patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;patch;delete
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=list;create;delete

// maxBody bounds an action's request body.
const maxBody = 1 << 20

// vmActions are the VM subresources. They act as kubevisor-api, once the generic server's
// SubjectAccessReview allowed the user the subresource (update virtualmachines/stop...), as
// KubeVirt does: the user needs no right on the VM itself.
type vmActions struct {
	reader client.Reader
	writer client.Client
}

// vmAction does one action on the VM ns/name with the request's body and answers the message
// of a success; its errors are API errors (404, 409, 400...).
type vmAction func(ctx context.Context, ns, name string, body []byte) (string, error)

// all maps each VM subresource to its action.
func (a *vmActions) all() map[string]vmAction {
	return map[string]vmAction{
		subv1.SubresourceStart:           a.start,
		subv1.SubresourceStop:            a.stop,
		subv1.SubresourceRestart:         a.restart,
		subv1.SubresourceMigrate:         a.migrate,
		subv1.SubresourceCancelMigration: a.cancelMigration,
	}
}

// connecter serves do as a PUT that answers 202 and a Success Status.
func (a *vmActions) connecter(do vmAction) *connecter {
	return &connecter{kind: vmKind, methods: []string{http.MethodPut},
		connect: func(ctx context.Context, ns, name string, _ runtime.Object, r rest.Responder) (http.Handler, error) {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				body, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
				if err != nil {
					r.Error(apierrors.NewBadRequest(fmt.Sprintf("read body: %v", err)))
					return
				}
				msg, err := do(req.Context(), ns, name, body)
				if err != nil {
					r.Error(err)
					return
				}
				r.Object(http.StatusAccepted, &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusAccepted, Message: msg})
			}), nil
		}}
}

// decodeBody reads an options body (empty is the zero options).
func decodeBody(body []byte, into any) error {
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, into); err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("decode body: %v", err))
	}
	return nil
}

// stopOptions reads a stop's body (StopOptions): the grace period it asks for, 0 when it forces
// the stop, nil for the VMI's own. A negative grace period is a 400.
func stopOptions(body []byte) (*int64, error) {
	var opts subv1.StopOptions
	if err := decodeBody(body, &opts); err != nil {
		return nil, err
	}
	grace := opts.GracePeriodSeconds
	if opts.Force {
		grace = ptr.To[int64](0)
	}
	if grace != nil && *grace < 0 {
		return nil, apierrors.NewBadRequest("gracePeriodSeconds must not be negative")
	}
	return grace, nil
}

// restartOptions reads a restart's body (RestartOptions): the grace period it asks for, nil
// for the VMI's own. A negative grace period is a 400.
func restartOptions(body []byte) (*int64, error) {
	var opts subv1.RestartOptions
	if err := decodeBody(body, &opts); err != nil {
		return nil, err
	}
	if g := opts.GracePeriodSeconds; g != nil && *g < 0 {
		return nil, apierrors.NewBadRequest("gracePeriodSeconds must not be negative")
	}
	return opts.GracePeriodSeconds, nil
}

// migrateOptions reads a migrate's body (MigrateOptions): whether it is a dry run. A dryRun
// value other than "All" is a 400.
func migrateOptions(body []byte) (dryRun bool, err error) {
	var opts subv1.MigrateOptions
	if err := decodeBody(body, &opts); err != nil {
		return false, err
	}
	for _, d := range opts.DryRun {
		if d != metav1.DryRunAll {
			return false, apierrors.NewBadRequest(fmt.Sprintf("dryRun %q: only %q is supported", d, metav1.DryRunAll))
		}
		dryRun = true
	}
	return dryRun, nil
}

// getVM reads the VM and its VMI (nil when none), and its run strategy.
func (a *vmActions) getVM(ctx context.Context, ns, name string) (*v1alpha1.VirtualMachine, *v1alpha1.VirtualMachineInstance, v1alpha1.VirtualMachineRunStrategy, error) {
	m := &v1alpha1.VirtualMachine{}
	if err := a.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, "", apierrors.NewNotFound(vmResource, name)
		}
		return nil, nil, "", apierrors.NewInternalError(fmt.Errorf("get VM %s/%s: %w", ns, name, err))
	}
	strategy, err := vm.RunStrategy(m.Spec)
	if err != nil {
		return nil, nil, "", apierrors.NewConflict(vmResource, name, err)
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := a.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, vmi); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, nil, "", apierrors.NewInternalError(fmt.Errorf("get VMI %s/%s: %w", ns, name, err))
		}
		vmi = nil
	}
	if vmi != nil && !metav1.IsControlledBy(vmi, m) {
		// A VMI of the same name that the VM does not control is not the VM's.
		vmi = nil
	}
	return m, vmi, strategy, nil
}

// active says vmi exists, is not being deleted and has not finished.
func active(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi != nil && vmi.DeletionTimestamp == nil && !vmi.Status.Phase.IsFinal()
}

func conflict(name, format string, args ...any) error {
	return apierrors.NewConflict(vmResource, name, fmt.Errorf(format, args...))
}

// start makes the VM run: Halted becomes Always; Manual and RerunOnFailure get a Start request,
// as KubeVirt does. A VM whose VMI is active, or whose strategy starts it anyway (Always) or
// never again (Once), is a 409.
func (a *vmActions) start(ctx context.Context, ns, name string, body []byte) (string, error) {
	if err := decodeBody(body, &subv1.StartOptions{}); err != nil {
		return "", err
	}
	m, vmi, strategy, err := a.getVM(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if active(vmi) {
		return "", conflict(name, "VM %s is already running", name)
	}
	switch strategy {
	case v1alpha1.RunStrategyHalted:
		if err := a.setRunStrategy(ctx, m, v1alpha1.RunStrategyAlways); err != nil {
			return "", err
		}
		return fmt.Sprintf("VM %s: runStrategy Always", name), nil
	case v1alpha1.RunStrategyManual, v1alpha1.RunStrategyRerunOnFailure:
		if err := a.request(ctx, m, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
			return "", err
		}
		return fmt.Sprintf("VM %s: start requested", name), nil
	default:
		return "", conflict(name, "VM %s has runStrategy %s, which does not take start requests", name, strategy)
	}
}

// stop makes the VM stop: Manual gets a Stop request for its VMI, every other strategy becomes
// Halted. A grace period (or force, a grace period of 0) is first written into the active VMI's
// spec.terminationGracePeriodSeconds, which the node's shutdown reads. A VM that is Halted, or
// Manual without an active VMI, is a 409 unless a grace period shortens a stop in progress.
func (a *vmActions) stop(ctx context.Context, ns, name string, body []byte) (string, error) {
	grace, err := stopOptions(body)
	if err != nil {
		return "", err
	}
	m, vmi, strategy, err := a.getVM(ctx, ns, name)
	if err != nil {
		return "", err
	}
	// A grace period applies to a VMI that has not finished, even one already stopping.
	shorten := grace != nil && vmi != nil && !vmi.Status.Phase.IsFinal()
	if shorten {
		if err := a.setGracePeriod(ctx, vmi, *grace); err != nil {
			return "", err
		}
	}
	switch {
	case strategy == v1alpha1.RunStrategyHalted || strategy == v1alpha1.RunStrategyManual && !active(vmi):
		if !shorten {
			return "", conflict(name, "VM %s is not running", name)
		}
		return fmt.Sprintf("VM %s: stop grace period %ds", name, *grace), nil
	case strategy == v1alpha1.RunStrategyManual:
		if err := a.request(ctx, m, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: ptr.To(vmi.UID)}); err != nil {
			return "", err
		}
		return fmt.Sprintf("VM %s: stop requested", name), nil
	default:
		if err := a.setRunStrategy(ctx, m, v1alpha1.RunStrategyHalted); err != nil {
			return "", err
		}
		return fmt.Sprintf("VM %s: runStrategy Halted", name), nil
	}
}

// restart deletes the VM's active VMI so that its controller creates a new one (Manual: a Stop
// then a Start request). A Halted VM or one without an active VMI is a 409.
func (a *vmActions) restart(ctx context.Context, ns, name string, body []byte) (string, error) {
	grace, err := restartOptions(body)
	if err != nil {
		return "", err
	}
	m, vmi, strategy, err := a.getVM(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if strategy == v1alpha1.RunStrategyHalted {
		return "", conflict(name, "VM %s is halted: start it instead", name)
	}
	if !active(vmi) {
		return "", conflict(name, "VM %s is not running", name)
	}
	if grace != nil {
		if err := a.setGracePeriod(ctx, vmi, *grace); err != nil {
			return "", err
		}
	}
	if strategy == v1alpha1.RunStrategyManual {
		err := a.request(ctx, m,
			v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: ptr.To(vmi.UID)},
			v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("VM %s: restart requested", name), nil
	}
	err = a.writer.Delete(ctx, vmi, client.Preconditions{UID: ptr.To(vmi.UID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("delete VMI %s/%s: %w", ns, name, err)
	}
	return fmt.Sprintf("VM %s: VMI deleted, its controller starts a new one", name), nil
}

// migrate creates a migration of the VM's running VMI (only validated under dryRun All). A VMI
// that is not running, or one already migrating, is a 409.
func (a *vmActions) migrate(ctx context.Context, ns, name string, body []byte) (string, error) {
	dryRun, err := migrateOptions(body)
	if err != nil {
		return "", err
	}
	var createOpts []client.CreateOption
	if dryRun {
		createOpts = []client.CreateOption{client.DryRunAll}
	}
	_, vmi, _, err := a.getVM(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if !active(vmi) || vmi.Status.Phase != v1alpha1.Running {
		return "", conflict(name, "VM %s is not running", name)
	}
	inProgress, err := a.migrations(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if len(inProgress) > 0 {
		return "", conflict(name, "migration %s of VMI %s is already in progress", inProgress[0].Name, name)
	}
	mig := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: name + "-migration-"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: name},
	}
	if err := a.writer.Create(ctx, mig, createOpts...); err != nil {
		return "", fmt.Errorf("create migration of VMI %s/%s: %w", ns, name, err)
	}
	if len(createOpts) > 0 {
		return fmt.Sprintf("VM %s: migration validated (dry run)", name), nil
	}
	return fmt.Sprintf("VM %s: migration %s created", name, mig.Name), nil
}

// cancelMigration deletes the migrations of the VM's VMI that are in progress; none is a 404.
func (a *vmActions) cancelMigration(ctx context.Context, ns, name string, _ []byte) (string, error) {
	if _, _, _, err := a.getVM(ctx, ns, name); err != nil {
		return "", err
	}
	inProgress, err := a.migrations(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if len(inProgress) == 0 {
		return "", apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("virtualmachineinstancemigrations").GroupResource(),
			fmt.Sprintf("in progress for VMI %s", name))
	}
	var names []string
	for i := range inProgress {
		if err := a.writer.Delete(ctx, &inProgress[i]); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("delete migration %s/%s: %w", ns, inProgress[i].Name, err)
		}
		names = append(names, inProgress[i].Name)
	}
	return fmt.Sprintf("VM %s: migration %v cancelled", name, names), nil
}

// migrations lists the migrations of VMI ns/vmiName that have not finished and are not being deleted.
func (a *vmActions) migrations(ctx context.Context, ns, vmiName string) ([]v1alpha1.VirtualMachineInstanceMigration, error) {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := a.reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("list migrations in %s: %w", ns, err))
	}
	return slices.DeleteFunc(list.Items, func(m v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Spec.VMIName != vmiName || m.DeletionTimestamp != nil ||
			m.Status.Phase == v1alpha1.MigrationSucceeded || m.Status.Phase == v1alpha1.MigrationFailed
	}), nil
}

// setRunStrategy writes spec.runStrategy and drops the legacy spec.running (they are exclusive).
func (a *vmActions) setRunStrategy(ctx context.Context, m *v1alpha1.VirtualMachine, s v1alpha1.VirtualMachineRunStrategy) error {
	base := m.DeepCopy()
	m.Spec.RunStrategy, m.Spec.Running = ptr.To(s), nil
	if err := a.writer.Patch(ctx, m, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("set runStrategy %s of VM %s/%s: %w", s, m.Namespace, m.Name, err)
	}
	return nil
}

// request appends state change requests to the VM's status, starting over on a conflict.
func (a *vmActions) request(ctx context.Context, m *v1alpha1.VirtualMachine, rs ...v1alpha1.VirtualMachineStateChangeRequest) error {
	key := client.ObjectKeyFromObject(m)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.VirtualMachine{}
		if err := a.reader.Get(ctx, key, cur); err != nil {
			return err
		}
		base := cur.DeepCopy()
		cur.Status.StateChangeRequests = append(cur.Status.StateChangeRequests, rs...)
		return a.writer.Status().Patch(ctx, cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("request %s of VM %s: %w", rs[0].Action, key, err)
	}
	return nil
}

// setGracePeriod writes the VMI's spec.terminationGracePeriodSeconds. The admission webhook
// (ValidateVMISpecUpdate) forbids every VMI spec change today, so in a cluster with the webhook
// this write, and the stop or restart that asked for it, fail with the webhook's Forbidden until
// it lets kubevisor-api change this field.
func (a *vmActions) setGracePeriod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, seconds int64) error {
	base := vmi.DeepCopy()
	vmi.Spec.TerminationGracePeriodSeconds = ptr.To(seconds)
	if err := a.writer.Patch(ctx, vmi, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("set the grace period of VMI %s/%s to %ds: %w", vmi.Namespace, vmi.Name, seconds, err)
	}
	return nil
}
